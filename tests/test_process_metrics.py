"""The exporter's ``process_*`` families (gpuwarden.collectors.exporter.process_values, read through
prometheus_client's ProcessCollector, which every Prometheus client library's process metrics follow)."""

from __future__ import annotations

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
    CPU within a clock tick or two, descriptors within the one listdir opens."""
    ours = exporter.process_values()
    theirs = _collector_values()
    assert set(ours) == set(theirs) == {
        "process_virtual_memory_bytes", "process_resident_memory_bytes", "process_start_time_seconds",
        "process_cpu_seconds_total", "process_open_fds", "process_max_fds",
    }  # fmt: skip
    assert ours["process_start_time_seconds"] == theirs["process_start_time_seconds"]
    assert ours["process_max_fds"] == theirs["process_max_fds"]
    assert abs(ours["process_open_fds"] - theirs["process_open_fds"]) <= 1
    assert ours["process_virtual_memory_bytes"] == pytest.approx(theirs["process_virtual_memory_bytes"], rel=0.01)
    assert ours["process_resident_memory_bytes"] == pytest.approx(theirs["process_resident_memory_bytes"], rel=0.05)
    assert ours["process_cpu_seconds_total"] == pytest.approx(theirs["process_cpu_seconds_total"], abs=0.05)


def test_without_proc_the_families_are_absent_never_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """No /proc (a locked-down container): every family is absent, never a zero."""
    real_open = open

    def no_proc(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).startswith("/proc/"):
            raise PermissionError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    assert exporter.process_values() == {}
