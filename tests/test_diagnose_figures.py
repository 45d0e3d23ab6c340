"""One starved figure per GPU in ``gpuwarden diagnose``: the table's starved and active columns are the verdict's own
evidence over the diagnosis window, named in the header, never the 5-minute score beside a 1-minute verdict."""

from __future__ import annotations

import io

from conftest import trace
from rich.console import Console

from gpuwarden.commands.diagnose import render, replay_report, summary_table, window_words


def _text(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=140, color_system=None).print(renderable)
    return out.getvalue()


def test_table_shows_the_verdicts_window_not_the_score_window() -> None:
    report = replay_report(trace("h100-starved_dataloader"))
    doc = report.diagnosis
    [g] = doc.gpus
    assert g.diagnosis is not None
    share, active = g.diagnosis.value("starved_share"), g.diagnosis.activity()
    assert share is not None and active is not None
    # a score window that disagrees with the verdict's (as a daemon's 5-minute ratio does after a job change)
    other = doc.model_copy(update={"gpus": [g.model_copy(update={"starved_ratio": 0.5, "activity_ratio": 0.37})]})
    row = [ln for ln in _text(summary_table(other)).splitlines() if ln.startswith("│") and "0 │" in ln[:6]][0]
    assert f"{share:.0%}" in row and f"{active:.0%}" in row, row
    assert "50%" not in row and "37%" not in row, row


def test_header_names_the_window_the_figures_cover() -> None:
    report = replay_report(trace("h100-starved_dataloader"))
    [g] = report.diagnosis.gpus
    assert g.diagnosis is not None
    seconds = round(g.diagnosis.window_seconds)
    assert window_words(report.diagnosis) == f"the last {seconds} s of each GPU's current job"
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None), brief=True)
    assert f"starved and active shares on the last {seconds} s" in " ".join(out.getvalue().split())


def test_no_window_before_any_verdict() -> None:
    report = replay_report(trace("h100-starved_dataloader"))
    empty = report.diagnosis.model_copy(update={"gpus": []})
    assert window_words(empty) is None
