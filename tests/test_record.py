"""``gpuwarden record`` survives what ends recordings early: SIGKILL, SIGTERM, bad arguments, an existing file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import trace

from gpuwarden.trace import TraceError, read_trace, read_trace_losses

_RECORD = """
import sys
from pathlib import Path
from gpuwarden.commands.record import record
from gpuwarden.replay import ReplaySource
print(record(ReplaySource(Path(sys.argv[1])), Path(sys.argv[2]), 60.0, 0.05, {"scenario": "test"}), flush=True)
"""


def _start(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECORD, str(trace("h200x2-ddp_straggler")), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _complete_polls(out) < 5:
        time.sleep(0.05)
    return proc


def _complete_polls(out: Path) -> int:
    """How many whole polls the recording being written holds so far (0 before its header is out)."""
    if not out.exists() or out.stat().st_size == 0:
        return 0
    try:
        return len(read_trace_losses(out)[1])
    except TraceError:  # the header itself not yet whole
        return 0


@pytest.mark.e2e
@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl"])
def test_a_recording_killed_replays_its_complete_polls(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"t{suffix}"
    proc = _start(out)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    header, polls, losses = read_trace_losses(out)
    assert header.metadata["scenario"] == "test"
    assert len(polls) >= 5 and all(len(p.gpus) == 2 for p in polls)
    # a kill between two flushed polls leaves nothing to drop; inside one, the loss is said
    assert losses is None or "dropped" in losses


@pytest.mark.e2e
def test_sigterm_ends_a_recording_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl.gz"
    proc = _start(out)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "stopped_by='SIGTERM'" in stdout
    header, polls, losses = read_trace_losses(out)
    assert losses is None and len(polls) >= 5


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwarden", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "10", "--poll.interval", "0"], "--poll.interval must be a number of seconds from 0.05 to 300"),
        (["--duration", "10", "--interval", "0"], "--poll.interval must be a number of seconds from 0.05 to 300"),
        (["--duration", "nan"], "--duration must be a number of seconds"),
        (["--duration", "-1"], "--duration must be a number of seconds"),
        (["--duration", "inf"], "--duration must be a number of seconds"),
        (["--duration", "5", "--poll.slow-interval", "0"], "--poll.slow-interval must be"),
    ],
)
@pytest.mark.e2e
def test_bad_record_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    res = gw("record", "--out", str(tmp_path / "t.jsonl"), *args)
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.e2e
def test_record_does_not_overwrite_silently(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    out.write_text("keep me\n")
    res = gw("record", "--out", str(out), "--duration", "1")
    assert res.returncode == 2 and "exists" in res.stderr and "--force" in res.stderr
    assert out.read_text() == "keep me\n"


def test_a_trace_cut_inside_a_line_reads_up_to_it(tmp_path: Path) -> None:
    import gzip

    text = gzip.decompress(trace("h100-idle").read_bytes()).decode()
    cut = tmp_path / "t.jsonl"
    cut.write_text(text[: len(text) * 2 // 3])
    header, polls, losses = read_trace_losses(cut)
    assert losses is not None and "cut off" in losses
    assert polls == read_trace(trace("h100-idle"))[1][: len(polls)]


def test_a_full_disk_keeps_the_polls_written_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from gpuwarden import trace as trace_module
    from gpuwarden.commands.record import record
    from gpuwarden.replay import ReplaySource

    real = trace_module.TraceWriter.write

    def write(self, poll) -> None:  # noqa: ANN001
        if self.polls == 3:
            self._seq += 1
            self._broken = True
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, poll)

    monkeypatch.setattr(trace_module.TraceWriter, "write", write)
    out = tmp_path / "t.jsonl.gz"
    result = record(ReplaySource(trace("h100-idle")), out, 60.0, 0.01, {})
    assert result.polls == 3 and result.error is not None and "No space left" in result.error
    _, polls = read_trace(out)
    assert len(polls) == 3


def test_a_full_disk_before_the_header_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC at the header's flush (a gzip trace's first bytes): the error is raised (``gpuwarden record`` says it in
    one line, exit 1) and no empty file that reads as a trace is left."""
    import errno

    from gpuwarden import trace as trace_module
    from gpuwarden.commands.record import record
    from gpuwarden.replay import ReplaySource

    def full(self) -> None:  # noqa: ANN001
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trace_module.TraceWriter, "_flush", full)
    out = tmp_path / "t.jsonl.gz"
    with pytest.raises(OSError, match="No space left"):
        record(ReplaySource(trace("h100-idle")), out, 60.0, 0.01, {})
    assert not out.exists()


def test_progress_is_reported_after_each_poll_written(tmp_path: Path) -> None:
    from gpuwarden.commands.record import record
    from gpuwarden.replay import ReplaySource

    seen: list[tuple[int, float]] = []
    result = record(
        ReplaySource(trace("h100-idle")), tmp_path / "t.jsonl", 0.2, 0.05, {}, progress=lambda n, s: seen.append((n, s))
    )
    assert [n for n, _ in seen] == list(range(1, result.polls + 1)) and result.polls >= 4
    assert all(b[1] >= a[1] for a, b in zip(seen, seen[1:], strict=False)) and seen[-1][1] <= 0.5


def test_the_header_carries_the_verdicts_of_the_live_analyzer_at_the_end(tmp_path: Path) -> None:
    """record runs the daemon's analyzer over the polls it writes and puts its final verdicts into the header; the
    replay of the trace gives the same ones."""
    from gpuwarden.commands.record import record
    from gpuwarden.insight.evaluation import evaluate
    from gpuwarden.replay import ReplaySource

    out = tmp_path / "t.jsonl.gz"
    result = record(ReplaySource(trace("h200x2-ddp_straggler")), out, 3.0, 0.05, {"scenario": "test"})
    header, polls = read_trace(out)
    assert result.error is None and len(polls) == result.polls >= 50
    live = header.metadata["live_verdicts"]
    assert header.metadata["scenario"] == "test" and set(live) == {"0", "1"}, header.metadata
    assert result.live_verdicts == live and set(header.metadata["live_findings"]) == {"0", "1"}
    assert {str(r.gpu): r.given for r in evaluate(out)} == live
