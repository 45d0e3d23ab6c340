"""The exporter's own ``process_*`` families (gpuwarden.collectors.exporter.process_values) against
prometheus_client's ProcessCollector, which every Prometheus client library's process metrics follow."""

from __future__ import annotations

import resource

import pytest
from prometheus_client import ProcessCollector

from gpuwarden.collectors import exporter


def _collector_values() -> dict[str, float]:
    out = {}
    for fam in ProcessCollector(registry=None).collect():
        for s in fam.samples:
            out[s.name] = float(s.value)
    return out


def test_the_values_are_prometheus_clients() -> None:
    """Same families, same numbers: start time and limit exactly, memory within the pages one read apart can move,
    CPU within what the two reads themselves spend (a clock tick or two), descriptors within the one listdir opens."""
    ours = exporter.process_values()
    theirs = _collector_values()
    assert set(ours) == set(theirs)
    assert ours["process_start_time_seconds"] == pytest.approx(theirs["process_start_time_seconds"], abs=0.011)
    assert ours["process_max_fds"] == theirs["process_max_fds"]
    assert abs(ours["process_open_fds"] - theirs["process_open_fds"]) <= 1
    assert ours["process_virtual_memory_bytes"] == pytest.approx(theirs["process_virtual_memory_bytes"], rel=0.01)
    assert ours["process_resident_memory_bytes"] == pytest.approx(theirs["process_resident_memory_bytes"], rel=0.05)
    assert ours["process_cpu_seconds_total"] == pytest.approx(theirs["process_cpu_seconds_total"], abs=0.05)


def test_an_unlimited_descriptor_limit_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLIM_INFINITY is no maximum: the family is absent, not a sentinel number."""
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    values = exporter.process_values()
    assert "process_max_fds" not in values
    assert values["process_open_fds"] >= 3


def test_without_proc_only_what_the_system_calls_give_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """No /proc (a locked-down container): the memory and descriptor families are absent, never zero."""
    real_open = open

    def no_proc(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).startswith("/proc/"):
            raise PermissionError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    values = exporter.process_values()
    assert "process_resident_memory_bytes" not in values and "process_open_fds" not in values
    assert values["process_cpu_seconds_total"] > 0
