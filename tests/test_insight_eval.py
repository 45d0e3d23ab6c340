"""Every recording gets the verdict (and findings) its header expects: bench/insight_eval.py's table, asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TRACES

from gpuwarden.insight.evaluation import evaluate

PATHS = sorted(TRACES.glob("*.jsonl.gz"))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_recording_gets_its_expected_verdict(path: Path) -> None:
    rows = evaluate(path)
    assert rows and all(r.expected is not None for r in rows), "the trace's header names no expected verdict"
    for r in rows:
        assert r.given == r.expected, (r.gpu, r.given, r.expected)
        assert not r.missing, (r.gpu, r.missing)
        # a verdict near its line (the workload sits at a threshold: self-paused 3 s busy, 1 s paused is PAUSED_MIN's
        # 25%) flips with the window's phase poll by poll; elsewhere the verdict holds most polls
        assert r.polls_right is not None and r.polls_right >= (0.4 if r.near_line else 0.5)


def test_a_trace_without_expectations_is_not_right(tmp_path: Path) -> None:
    import gzip
    import json

    lines = gzip.decompress((TRACES / "h100-idle.jsonl.gz").read_bytes()).decode().split("\n")
    header = json.loads(lines[0])
    header["metadata"].pop("expected_verdicts")
    lines[0] = json.dumps(header)
    out = tmp_path / "t.jsonl"
    out.write_text("\n".join(lines))
    [row] = evaluate(out)
    assert row.expected is None and row.given == "free" and not row.ok
