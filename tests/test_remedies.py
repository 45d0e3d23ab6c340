"""What to do first follows the evidence: of input_starved's remedies, the one for where the input comes from leads
(remote storage for a job waiting on sockets, a local cache for one reading files, the DataLoader for one whose CPU
prepares it), on real H100 recordings of each."""

from __future__ import annotations

import pytest
from conftest import TRACES

from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.replay import ReplaySource
from gpuwarden.trace import read_trace


def _diagnosis_at_end(name: str):  # type: ignore[no-untyped-def]
    path = TRACES / f"{name}.jsonl.gz"
    source = ReplaySource(path, timing="recorded", loop=False)
    header = source.open()
    analyzer = InsightAnalyzer()
    res = None
    for _ in range(len(read_trace(path)[1])):
        res = analyzer(source.poll(), header)
    assert res is not None and res.gpus[0].diagnosis is not None
    return res.gpus[0].diagnosis


@pytest.mark.parametrize(
    ("name", "first"),
    [("h100-k-remote-reader-workers-0-size-1024", "Input from remote storage"),
     ("h100-k-remote-reader-workers-4-size-4096", "Input from remote storage"),
     ("h100-k-io-reader-size-256", "Cache preprocessed data"),
     ("h100-starved_dataloader", "Move input work off the training loop")],
)  # fmt: skip
def test_the_first_remedy_is_the_one_the_evidence_points_at(name: str, first: str) -> None:
    d = _diagnosis_at_end(name)
    assert d.verdict == "input_starved" and d.remedies[0].startswith(first), d.remedies[0]
    assert len(d.remedies) == len(set(d.remedies))  # reordered, none lost or repeated


def test_every_reason_is_declared_once_with_a_severity_and_what_to_do() -> None:
    """A verdict is one row of gpuwarden.insight.rules.RULES (rule, summary, severity, remedies; the rows' order is the
    order the rules are tried, the last always holding), a finding one row of FINDINGS: each reason once, with a
    severity the diagnosis knows and at least one remedy, each a sentence."""
    from gpuwarden.insight.reasons import FINDINGS, REASON_TABLE, REASONS, VERDICT_ORDER
    from gpuwarden.insight.rules import RULES

    assert len(set(REASONS)) == len(REASONS) == len(RULES) + len(FINDINGS)
    assert VERDICT_ORDER == REASONS[: len(RULES)] and RULES[VERDICT_ORDER[-1]].when is None
    assert [r.when is None for r in RULES.values()].count(True) == 1  # only the last resort always holds
    for r in REASON_TABLE:
        assert r.severity in ("ok", "info", "warning", "critical"), r.name
        assert r.remedies and all(text == text.strip() and text.endswith((".", ")")) for text in r.remedies), r.name
