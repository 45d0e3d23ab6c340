"""Machine text on a terminal: a process, job or host named with Rich markup or escape sequences is shown as it is
(control characters visible), never obeyed, in diagnose and in top/report's tables."""

from __future__ import annotations

import io

import pytest
from conftest import trace
from rich.console import Console
from rich.table import Table

from gpuwarden.cluster.views import _row
from gpuwarden.commands.diagnose import render, replay_report
from gpuwarden.insight.vocabulary.result import JobInsight
from gpuwarden.terminal import visible

HOSTILE = "[/][link=file:///etc/passwd]x[/link]\x1b]0;pwned\x07\x1b[2J"


def test_control_characters_are_made_visible_and_other_scripts_kept() -> None:
    assert visible("ok-Ñame_名前") == "ok-Ñame_名前"
    assert visible("a\x1b[2Jb\rc\x07") == "a\\x1b[2Jb\\rc\\x07"


def _printed(renderable_owner: object) -> str:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, color_system=None)
    console.print(renderable_owner)
    return out.getvalue()


def test_diagnose_shows_hostile_host_and_job_names_as_text() -> None:
    report = replay_report(trace("h100-starved_dataloader"))
    job = JobInsight(job=HOSTILE, job_kind="process", gpus=[0], pids=[1])
    doc = report.diagnosis.model_copy(update={"hostname": HOSTILE, "jobs": [job]})
    report = report.model_copy(update={"diagnosis": doc, "source": HOSTILE})
    out = io.StringIO()
    render(report, Console(file=out, width=200, force_terminal=False, color_system=None))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text  # no escape sequence reaches the terminal
    assert "[/][link=file:///etc/passwd]x[/link]\\x1b]0;pwned\\x07" in text.replace("\n", "")


def test_top_and_report_rows_show_markup_as_text() -> None:
    t = Table()
    t.add_column("job")
    t.add_column("node")
    _row(t, HOSTILE, "node[bold]1")
    text = _printed(t)
    assert "[/][link=file:///etc/passwd]x" in text and "node[bold]1" in text and "\x1b" not in text


def test_progress_is_shown_on_a_terminal_only(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                                              ) -> None:  # fmt: skip
    from gpuwarden.terminal import progress

    with progress("ticks \x1b[2J") as advance:
        advance(3, 10)
    assert capsys.readouterr().err == ""  # a pipe: nothing
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: a terminal, whatever the file is
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    with progress("ticks \x1b[2J") as advance:
        advance(3, 10)
    err = capsys.readouterr().err
    assert "ticks \\x1b[2J" in err and "3/10" in err and "\x1b[2J" not in err
