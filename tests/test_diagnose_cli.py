"""``gpuwarden diagnose``: every scenario's trace gets its verdict; JSON; errors; the API document."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from test_insight_diagnosis import EXPECTED
from test_insight_helpers import DDP, h100, run_trace, snap_of

from gpuwarden.cli import build_parser
from gpuwarden.commands import diagnose
from gpuwarden.replay import demo_trace_path
from gpuwarden.snapshot import NodeSnapshot
from gpuwarden.web.diagnosis import diagnosis_document


def cli(argv: list[str]) -> int:
    args = build_parser("diagnose").parse_args(argv)
    return args.run(args)


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_replay_prints_each_scenarios_verdict(scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["diagnose", "--replay", str(h100(scenario))]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps to the terminal width
    assert EXPECTED[scenario].replace("_", " ") in out
    assert f"scenario {scenario}" in out


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_replay_json_has_the_verdict(scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["diagnose", "--replay", str(h100(scenario)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"] == scenario and doc["diagnosis"]["available"] is True
    (gpu,) = doc["diagnosis"]["gpus"]
    assert gpu["diagnosis"]["verdict"] == EXPECTED[scenario]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"


def test_replay_of_the_ddp_straggler(capsys: pytest.CaptureFixture[str]) -> None:
    if not DDP.exists():
        pytest.skip("2xH200 ddp_straggler trace not recorded")
    assert cli(["diagnose", "--replay", str(DDP), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["diagnosis"]
    assert [g["diagnosis"]["verdict"] for g in doc["gpus"]] == ["waiting_on_peers", "input_starved"]
    assert doc["jobs"][0]["gpus"] == [0, 1]


def test_demo_trace_timeline_follows_the_recorded_scenarios() -> None:
    report = diagnose.replay_report(demo_trace_path())
    verdicts = [s.verdict for s in report.timeline if s.verdict not in (None, "starting") and s.polls >= 2]
    # the session recorded idle, compute_bound, starved_dataloader, starved_cpu_heavy, h2d_pageable_copy,
    # held_idle in that order, with the GPU free between them; each job seen to arrive starts up first (the first
    # one was there when the recording began)
    seen = [s.verdict for s in report.timeline if s.verdict is not None]
    assert [seen[i + 1] for i, v in enumerate(seen[:-1]) if v == "starting"] == [
        "input_starved",
        "input_starved",
        "h2d_copy_bound",
        "held_idle",
    ]
    assert verdicts == [
        "free",
        "compute_bound",
        "free",
        "input_starved",
        "free",
        "input_starved",
        "free",
        "h2d_copy_bound",
        "free",
        "held_idle",
    ]
    console = Console(file=io.StringIO(), width=120)
    diagnose.render(report, console)
    assert isinstance(console.file, io.StringIO)
    text = console.file.getvalue()
    assert "verdicts over time" in text and "held idle" in text


def test_missing_trace_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["diagnose", "--replay", "/nonexistent/trace.jsonl.gz"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpuwarden: ") and err.count("\n") == 1


def test_live_without_nvml_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    from gpuwarden.source import SourceError

    def fail(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise SourceError("NVML not available: driver not loaded")

    from gpuwarden.commands import diagnose as command

    monkeypatch.setattr(command, "live_report", fail)
    assert cli(["diagnose", "--seconds", "1", "--json"]) == 1
    assert capsys.readouterr().err == "gpuwarden: NVML not available: driver not loaded\n"


def test_diagnosis_document_without_analysis_or_poll() -> None:
    static, polls, results = run_trace(h100("held_idle"))
    empty = NodeSnapshot(seq=0, source="nvml", static=static, poll=polls[-1], interval_seconds=1.0)
    doc = diagnosis_document(empty)
    assert doc.available is False and doc.reason and doc.gpus == []
    stale = snap_of(static, polls[-1], results[-1])
    stale = NodeSnapshot(**{**stale.__dict__, "poll": None})
    assert diagnosis_document(stale).available is False
    ok = diagnosis_document(snap_of(static, polls[-1], results[-1]))
    assert ok.available and ok.gpus[0].diagnosis.verdict == "held_idle"
    json.loads(ok.model_dump_json())


def test_the_api_document_carries_every_field_of_the_insight_it_extends() -> None:
    """GpuDiagnosisDocument extends GpuInsight: idle causes, held-idle energy and shortfall (what /metrics exports)
    are in the API document too, with the same values."""
    from gpuwarden.insight.vocabulary.result import GpuInsight

    static, polls, results = run_trace(h100("held_idle"))
    doc = diagnosis_document(snap_of(static, polls[-1], results[-1]))
    assert set(GpuInsight.model_fields) <= set(doc.gpus[0].model_dump())
    for g, insight in zip(doc.gpus, results[-1].gpus, strict=True):
        assert g.idle_seconds_total == insight.idle_seconds_total and g.idle_seconds_total
        assert g.held_idle_energy_joules_total == insight.held_idle_energy_joules_total
        assert g.shortfall_ratio == insight.shortfall_ratio
