"""The replay reads its trace a poll at a time: what it plays is what the whole trace read at once gives, it holds the
same memory for a long recording as for a short one, it resumes where it was after a close, and a trace that changes
under it is one line (gpuwarden.replay.ReplaySource, gpuwarden.trace.TracePass)."""

from __future__ import annotations

import gc
import gzip
import tracemalloc
from pathlib import Path

import pytest
from conftest import trace

from gpuwarden.replay import ReplaySource
from gpuwarden.source import SourceError
from gpuwarden.trace import TraceWriter, read_trace

REAL = trace("h200x2-ddp_straggler")  # recorded on 2x H200 (tests/data/traces/README.md)


def _longer(tmp_path: Path, passes: int) -> Path:
    """The recording played ``passes`` times end to end, each pass shifted by the trace's length (its header says
    ``modified``)."""
    header, polls = read_trace(REAL)
    span = polls[-1].timestamp - polls[0].timestamp + header.poll_interval_seconds
    meta = {**header.metadata, "modified": f"{REAL.name} written {passes} times end to end, shifted in time"}
    out = tmp_path / f"long-{passes}.jsonl.gz"
    with TraceWriter(out, header.model_copy(update={"metadata": meta})) as w:
        for k in range(passes):
            for p in polls:
                w.write(p.shifted(k * span))
    return out


def _held_after_open(path: Path) -> tuple[int, ReplaySource]:
    gc.collect()
    tracemalloc.start()
    try:
        src = ReplaySource(path, timing="recorded")
        src.open()
        gc.collect()
        return tracemalloc.get_traced_memory()[0], src
    finally:
        tracemalloc.stop()


def test_a_long_recording_holds_no_more_than_a_short_one(tmp_path: Path) -> None:
    short_held, short = _held_after_open(_longer(tmp_path, 1))
    long_held, long = _held_after_open(_longer(tmp_path, 20))
    assert long.polls_in_trace == 20 * short.polls_in_trace
    # holding the polls, twenty times the trace held about twenty times the memory
    assert long_held < 2 * short_held + 64 * 1024, (short_held, long_held)


def test_the_played_polls_are_the_trace_read_at_once_over_several_passes() -> None:
    header, polls = read_trace(REAL)
    src = ReplaySource(REAL, timing="recorded")
    src.open()
    n = len(polls)
    assert src.polls_in_trace == n
    for k in range(3):
        for rec in polls:
            played = src.poll()
            assert [g.uuid for g in played.gpus] == [g.uuid for g in rec.gpus]
            assert [g.utilization_gpu_ratio for g in played.gpus] == [g.utilization_gpu_ratio for g in rec.gpus]
            assert [g.memory_used_bytes for g in played.gpus] == [g.memory_used_bytes for g in rec.gpus]
            assert played.timestamp - rec.timestamp == pytest.approx(src._anchor + k * src._period)
        assert src.loops == k + 1


def test_a_replay_closed_in_the_middle_of_a_pass_resumes_where_it_was() -> None:
    src = ReplaySource(REAL, timing="recorded")
    src.open()
    first = [src.poll().timestamp for _ in range(5)]
    src.close()
    after = src.poll().timestamp
    again = ReplaySource(REAL, timing="recorded")
    again.open()
    expected = [again.poll().timestamp for _ in range(6)]
    assert [t - first[0] for t in [*first, after]] == pytest.approx([t - expected[0] for t in expected])


def test_a_trace_cut_short_under_the_replay_is_one_line(tmp_path: Path) -> None:
    path = _longer(tmp_path, 1)
    src = ReplaySource(path, timing="recorded")
    src.open()
    n = src.polls_in_trace
    for _ in range(n):
        src.poll()  # a whole pass; the next poll reads the file again
    text = gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)
    path.write_bytes(gzip.compress("".join(text[: len(text) // 2]).encode()))
    played = 0
    with pytest.raises(SourceError) as err:
        for _ in range(n):
            src.poll()
            played += 1
    assert 0 < played < n
    assert str(err.value) == f"{path}: the trace changed since it was opened (poll {played + 1} of {n} is gone)"
    path.unlink()
    with pytest.raises(SourceError, match=r"cannot read trace: No such file or directory$"):
        src.poll()


@pytest.mark.e2e  # 720 s of replay under tracemalloc
def test_diagnosing_a_long_recording_holds_what_a_shorter_one_past_the_window_holds(tmp_path: Path) -> None:
    """``gpuwarden diagnose --replay`` reads the trace a poll at a time: past the analyzer's 300 s window, four times
    twice the recording peaks at about the memory of the shorter one (holding the polls, it peaked at about twice)."""
    from gpuwarden.commands.diagnose import replay_report

    peaks = {}
    for passes in (12, 24):  # 360 s and 720 s of a 1 s recording: both fill the 300 s window
        path = _longer(tmp_path, passes)
        gc.collect()
        tracemalloc.start()
        try:
            report = replay_report(path)
            peaks[passes] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert report.polls == passes * read_trace(REAL)[1].__len__()
        assert report.diagnosis.gpus and all(g.diagnosis is not None for g in report.diagnosis.gpus)
    assert peaks[24] < 1.3 * peaks[12], peaks
