"""Load: concurrent scrapers against a daemon replaying 8 GPUs get every answer, complete, without error.

The issue's figure (200 scrapers for 60 s) is run by hand with ``python3 tools/loadtest.py`` and recorded in
docs/reliability.md; this test runs the same code, shorter (50 scrapers for 10 s), so CI stays bounded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).parent.parent
_spec = importlib.util.spec_from_file_location("loadtest", REPO / "tools" / "loadtest.py")
assert _spec is not None and _spec.loader is not None
loadtest = importlib.util.module_from_spec(_spec)
sys.modules["loadtest"] = loadtest  # the worker processes unpickle functions by module name
_spec.loader.exec_module(loadtest)

CLIENTS = 50
SECONDS = 10.0


def test_percentile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert [loadtest.percentile(values, q) for q in (0.5, 0.9, 0.99, 1.0)] == [50.0, 90.0, 99.0, 100.0]
    assert loadtest.percentile([], 0.5) == 0.0


@pytest.mark.e2e
def test_50_scrapers_for_10_seconds_against_8_replayed_gpus_have_no_error() -> None:
    proc, base = loadtest.start_daemon(loadtest.TRACE)
    try:
        body = httpx.get(f"{base}/metrics").text
        assert body.count("\ngpu_up{") == 8  # the derived trace's 8 GPUs
        result = loadtest.run(f"{base}/metrics", CLIENTS, SECONDS, procs=1, gpus=8)
        assert proc.poll() is None, "the daemon died under load"
    finally:
        code = loadtest.stop_daemon(proc)
    assert result.errors == 0, result.error_kinds
    assert result.requests >= 5 * CLIENTS, result  # every scraper was answered, many times
    assert 0 < result.p50 <= result.p90 <= result.p99 <= result.max < 30
    assert code == 0


def test_the_derived_trace_is_what_its_script_makes() -> None:
    from gpuwarden.trace import read_trace

    spec = importlib.util.spec_from_file_location("make_8gpu_trace", REPO / "tools" / "make_8gpu_trace.py")
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    header, polls = make.derive(make.SOURCE, 8)
    committed_header, committed_polls = read_trace(loadtest.TRACE)
    assert committed_header == header and committed_polls == polls
    assert "modified" in header.metadata and header.metadata["derived_from"].endswith("h200x2-ddp_straggler.jsonl.gz")
    assert len({g.uuid for g in header.node.gpus}) == 8 and [g.index for g in polls[0].gpus] == list(range(8))
