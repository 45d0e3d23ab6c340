"""``gpuwarden record``: poll a source for a while and write every poll to a trace."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.source import Source
from gpuwarden.trace import TraceHeader, TraceWriter


@dataclass(frozen=True)
class Recorded:
    """How a recording ended: ``polls`` written (each complete and readable), the signal that stopped it early
    (``SIGTERM``, ``SIGINT``) or None, and the write error that ended it (a full disk) or None."""

    polls: int
    stopped_by: str | None = None
    error: str | None = None


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
    try:
        header = TraceHeader(created=time.time(), poll_interval_seconds=interval, node=node, metadata=metadata)
        with TraceWriter(out, header, overwrite=overwrite) as writer:
            start = time.monotonic()
            next_at = start
            while not stop.is_set():
                try:
                    writer.write(source.poll())
                except OSError as exc:
                    return Recorded(writer.polls - 1, error=f"write failed: {exc.strerror or exc}")
                if progress is not None:
                    progress(writer.polls, time.monotonic() - start)
                next_at += interval
                if next_at - start > duration:
                    break
                stop.wait(max(0.0, next_at - time.monotonic()))
            return Recorded(writer.polls, stopped_by=stopped[0] if stopped else None)
    finally:
        source.close()
        for s, h in handlers.items():
            signal.signal(s, h)
