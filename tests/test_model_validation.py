"""Readings are validated wherever they are made: the NVML layer's, the replay's and the analysis's models refuse a
misspelt field, a value of the wrong type and a NaN as a trace read from disk does."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from gpuwarden.insight.vocabulary.result import ProcessJob
from gpuwarden.model import GpuReading, ProcessReading


def test_a_misspelt_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="pidd"):
        ProcessReading(pidd=1)  # type: ignore[call-arg]


def test_a_value_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ValidationError, match="gpu_memory_bytes"):
        ProcessReading(pid=1, gpu_memory_bytes="lots")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="gpu"):
        ProcessJob(gpu="first", uuid="GPU-a", pid=1, job="j", job_kind="slurm")  # type: ignore[arg-type]


def test_nan_is_refused_in_a_reading() -> None:
    with pytest.raises(ValidationError, match="power_usage_watts"):
        GpuReading(index=0, uuid="GPU-a", timestamp=1.0, up=True, power_usage_watts=math.nan)


def test_the_fields_given_are_the_fields_set() -> None:
    """A trace line holds the fields a poll read (``model_fields_set``): made with only some, the rest are unset."""
    r = GpuReading(index=0, uuid="GPU-a", timestamp=1.0, up=True, memory_used_bytes=5)
    assert r.model_fields_set == {"index", "uuid", "timestamp", "up", "memory_used_bytes"}
    assert r.memory_used_bytes == 5 and r.power_usage_watts is None
