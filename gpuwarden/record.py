"""``gpuwarden record``: poll a source for a while and write every poll to a trace.

While it records, the insight analyzer the daemon runs (same windows) reads every poll as it is written; at the end
its verdict on each GPU goes into the trace's header (``metadata.live_verdicts``: GPU index -> verdict, with
``live_findings``), so a replay of the trace can be held to what the daemon said live
(tests/test_insight_live_and_clock.py).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.insight.analyzer import DeferredInsight, InsightAnalyzer, insight_result
from gpuwarden.model import NodeStatic, PollResult
from gpuwarden.source import Source
from gpuwarden.trace import TraceHeader, TraceWriter, rewrite_header


@dataclass(frozen=True)
class Recorded:
    """How a recording ended: ``polls`` written (each complete and readable), the signal that stopped it early
    (``SIGTERM``, ``SIGINT``) or None, and the write error that ended it (a full disk) or None."""

    polls: int
    stopped_by: str | None = None
    error: str | None = None
    live_verdicts: dict[str, str] | None = None


class LiveVerdicts:
    """The daemon's insight analyzer run over the polls of a recording as they are written (``add``); ``metadata()``
    returns the verdict and findings of each GPU at the last poll (GPU index as a string -> verdict; GPUs still
    without one are left out)."""

    def __init__(self, static: NodeStatic) -> None:
        self.static = static
        self.analyzer = InsightAnalyzer()
        self.last: DeferredInsight | None = None

    def add(self, poll: PollResult) -> None:
        """Account ``poll`` (the result is built only when ``metadata`` asks for it)."""
        self.last = self.analyzer.prepare(poll, self.static)

    def metadata(self) -> dict[str, Any]:
        """``{"live_verdicts": {...}, "live_findings": {...}}`` at the last poll; empty before any poll."""
        res = insight_result(self.last) if self.last is not None else None
        if res is None:
            return {}
        verdicts = {str(g.gpu): g.diagnosis.verdict for g in res.gpus if g.diagnosis is not None}
        findings = {str(g.gpu): list(g.diagnosis.findings) for g in res.gpus if g.diagnosis is not None}
        return {"live_verdicts": verdicts, "live_findings": findings}


def record(
    source: Source,
    out: Path,
    duration: float,
    interval: float,
    metadata: dict[str, Any],
    overwrite: bool = True,
    progress: Callable[[int, float], None] | None = None,
) -> Recorded:
    """Open ``source``, poll it every ``interval`` s for ``duration`` s, write the trace to ``out``.

    SIGTERM and SIGINT (in the main thread) end the recording after the poll in hand, the trace closed and complete.
    A write that fails after the header (ENOSPC) ends it with the polls before it kept. Raises SourceError when the
    source cannot open, OSError when ``out`` cannot be created, FileExistsError when it exists and not
    ``overwrite``. ``progress(polls, seconds)``, if given, is called after each poll written. Every poll is
    flushed as it is written (gpuwarden.trace.TraceWriter), so a kill keeps the
    complete polls readable.
    """
    stop = threading.Event()
    stopped: list[str] = []

    def on_signal(sig: int, frame: object) -> None:
        stopped.append(signal.Signals(sig).name)
        stop.set()

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    node = source.open()
    live = LiveVerdicts(node)
    try:
        header = TraceHeader(created=time.time(), poll_interval_seconds=interval, node=node, metadata=metadata)
        with TraceWriter(out, header, overwrite=overwrite) as writer:
            start = time.monotonic()
            next_at = start
            while not stop.is_set():
                poll = source.poll()
                try:
                    writer.write(poll)
                except OSError as exc:
                    return Recorded(writer.polls - 1, error=f"write failed: {exc.strerror or exc}")
                live.add(poll)
                if progress is not None:
                    progress(writer.polls, time.monotonic() - start)
                next_at += interval
                if next_at - start > duration:
                    break
                stop.wait(max(0.0, next_at - time.monotonic()))
        extra = live.metadata()
        if extra:
            try:
                rewrite_header(out, header.model_copy(update={"metadata": {**metadata, **extra}}))
            except OSError as exc:  # the trace as written stays whole
                return Recorded(writer.polls, error=f"live verdicts not written to the header: {exc.strerror or exc}")
        return Recorded(
            writer.polls, stopped_by=stopped[0] if stopped else None, live_verdicts=extra.get("live_verdicts")
        )
    finally:
        source.close()
        for s, h in handlers.items():
            signal.signal(s, h)
