"""The interface every source of readings implements: live NVML or a recorded trace.

The poller (``gpuwarden.poller``) sees only this protocol, so the same readings give the same
metrics whichever source produced them.
"""

from __future__ import annotations

from typing import Protocol

from gpuwarden.model import NodeStatic, PollResult


class SourceError(Exception):
    """A source cannot start (no driver, unreadable trace). ``str()`` is one line for the user."""


class Source(Protocol):
    """A producer of polls.

    ``open()`` returns the node's static facts (raises SourceError when the source cannot start);
    ``poll()`` returns one PollResult and must not raise for a single GPU's failure (that GPU is
    reported with ``up=False``); ``errors()`` returns cumulative error counts keyed by
    (call, error name); ``close()`` releases everything (nvmlShutdown for NVML). ``up`` is False while the
    source cannot read at all (NVML re-initialising: such a poll counts as failed); ``static`` is the node's
    static facts as they stand now (they change once when a driver that was waited for appears), None before
    ``open()``.
    """

    kind: str

    @property
    def up(self) -> bool:
        """False while the source cannot read (its polls report every GPU down)."""
        ...

    @property
    def down_reason(self) -> str | None:
        """Why the source cannot read, in one line an operator acts on (the driver library missing, the driver
        reloaded); None while it reads."""
        ...

    @property
    def static(self) -> NodeStatic | None:
        """The node's static facts now; None before ``open()``."""
        ...

    def open(self) -> NodeStatic:
        """Start the source and return the node's static facts; raises SourceError."""
        ...

    def poll(self) -> PollResult:
        """Return one poll of every GPU."""
        ...

    def errors(self) -> dict[tuple[str, str], int]:
        """Return cumulative error counts by (call, error name)."""
        ...

    def close(self) -> None:
        """Release everything; idempotent."""
        ...
