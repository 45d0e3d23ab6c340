"""A training job stopped with SIGSTOP while it holds its GPU (Ctrl-Z, a debugger, a scheduler's suspend), recorded on
an H100 (h100-stopped: bf16 products 5 s, stopped 24 s, continued; tools/device-stopped.sh): its GPU is held idle,
the diagnosis says the process is stopped rather than that nobody uses the GPU, the evidence counts the stopped
process, and once it runs again the idleness endpoint says so at once."""

from __future__ import annotations

from conftest import TRACES

from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.insight.vocabulary.result import InsightResult
from gpuwarden.replay import ReplaySource
from gpuwarden.web.idleness import gpu_status

STOPPED = TRACES / "h100-stopped.jsonl.gz"


def _after(polls: int) -> InsightResult:
    source = ReplaySource(STOPPED, timing="recorded", loop=False)
    header = source.open()
    analyzer = InsightAnalyzer()
    res = None
    for _ in range(polls):
        res = analyzer(source.poll(), header)
    assert res is not None
    return res


def test_a_stopped_job_is_held_idle_and_named_stopped() -> None:
    diagnosis = _after(29).gpus[0].diagnosis
    assert diagnosis is not None and diagnosis.verdict == "held_idle"
    assert "process was stopped" in diagnosis.summary and "SIGCONT" in diagnosis.summary
    rows = {r.name: r.value for r in diagnosis.evidence}
    assert rows["job_processes_stopped"] is not None and rows["job_processes_stopped"] >= 0.5


def test_continued_it_reads_active_at_once_and_a_held_idle_job_that_runs_is_not_called_stopped() -> None:
    """After SIGCONT the latest interval is busy: /api/v1/idleness says active at once (the verdict follows its
    60 s window, most of which the job spent stopped). A held-idle job whose process runs (h100-held_idle) is not
    called stopped."""
    res = _after(41)
    assert gpu_status(res.gpus[0], res.timestamp)[0] == "active"
    held = TRACES / "h100-held_idle.jsonl.gz"
    source = ReplaySource(held, timing="recorded", loop=False)
    header = source.open()
    analyzer = InsightAnalyzer()
    for _ in range(20):
        res = analyzer(source.poll(), header)
    d = res.gpus[0].diagnosis
    assert d is not None and d.verdict == "held_idle" and "nobody is using this GPU" in d.summary
