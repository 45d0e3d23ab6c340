"""``gpuwarden record``: poll a source for a while and write every poll to a trace."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuwarden.source import Source
from gpuwarden.trace import TraceHeader, TraceWriter


def record(source: Source, out: Path, duration: float, interval: float, metadata: dict[str, Any]) -> int:
    """Open ``source``, poll it every ``interval`` s for ``duration`` s, write the trace to ``out``.

    Returns the number of polls written. Raises SourceError when the source cannot open.
    """
    node = source.open()
    try:
        header = TraceHeader(created=time.time(), poll_interval_seconds=interval, node=node, metadata=metadata)
        polls = 0
        with TraceWriter(out, header) as writer:
            start = time.monotonic()
            next_at = start
            while True:
                writer.write(source.poll())
                polls += 1
                next_at += interval
                if next_at - start > duration:
                    break
                time.sleep(max(0.0, next_at - time.monotonic()))
        return polls
    finally:
        source.close()
