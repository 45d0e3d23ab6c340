"""The exposition of every recorded trace, held byte for byte against a golden file.

The golden files in ``tests/data/golden`` were rendered from the recorded traces (40 polls each, with the insight
analyzer, recorded timing) and committed before the package was restructured; a refactor that changes any
family, label, help text or value fails here. Two families depend on the wall clock of the run (the time of the
last poll, the render time of each collector): their values are masked, their presence is not.

Regenerate (only for an intended change of the exposition): ``python3 tests/test_golden_expositions.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from conftest import DATA, TRACES, render, replay_poller  # noqa: E402

from gpuwarden.insight.analyzer import InsightAnalyzer  # noqa: E402
from gpuwarden.replay import demo_trace_path  # noqa: E402

GOLDEN = DATA / "golden"
POLLS = 40
_MASKED = (
    "gpuwarden_last_poll_success_timestamp_seconds",
    "gpuwarden_scrape_collector_duration_seconds",
    "gpu_xid_last_event_timestamp_seconds",
    "gpu_process_start_time_seconds",  # re-stamped to the replay's own time, as every timestamp of a replay
    "gpuwarden_config_last_reload_success_timestamp_seconds",
    "process_[a-z_]+",  # the test process's own memory, CPU and descriptors
)
_VOLATILE = re.compile(r"^((?:" + "|".join(_MASKED) + r")(?:\{[^}]*\})?) .*$", re.M)
PATHS = [demo_trace_path(), demo_trace_path("faults"), *sorted(TRACES.glob("*.jsonl.gz"))]


def exposition(path: Path) -> str:
    """The masked exposition of ``path`` after POLLS polls."""
    poller = replay_poller(path, POLLS, analyzers={"insight": InsightAnalyzer().prepare})
    assert poller.snapshot is not None
    return _VOLATILE.sub(r"\1 <masked>", render(poller.snapshot))


def golden_path(path: Path) -> Path:
    return GOLDEN / (path.name.removesuffix(".jsonl.gz") + ".prom")


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_exposition_equals_golden(path: Path) -> None:
    assert exposition(path) == golden_path(path).read_text()


def test_every_trace_has_a_golden_file() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.prom")) == sorted(golden_path(p).name for p in PATHS)


if __name__ == "__main__":
    GOLDEN.mkdir(exist_ok=True)
    for p in PATHS:
        golden_path(p).write_text(exposition(p))
