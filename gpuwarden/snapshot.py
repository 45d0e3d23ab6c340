"""The node snapshot: everything known about the node after one poll, which collectors and the API read.

Made by the poller (``gpuwarden.poller``), immutable once published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuwarden.model import GpuReading, NodeStatic, PollResult


@dataclass(frozen=True, slots=True)
class XidTotal:
    """XID events of one code on one GPU since the daemon started: count and last event (Unix s)."""

    count: int
    last_timestamp: float


@dataclass(frozen=True)
class NodeSnapshot:
    """Everything known about the node after one poll; what collectors and the API read.

    ``poll`` is None until the first poll succeeds, after a poll that raised, and while a poll hangs past the
    deadline. ``source_up`` is False when the last poll failed, the source reported itself down (NVML not
    initialised: every GPU ``up=False``) or a poll hangs; ``down_reason`` then says why in one line. ``xid`` maps
    GPU index -> XID code -> XidTotal; ``last_up`` GPU index -> that GPU's last reading while it was up (what is
    still known of a GPU now lost).
    ``errors`` maps (call, error) -> count. ``analyses`` holds what analyzers derived from the history, keyed by
    analyzer name (the snapshot layer knows none of them: ``gpuwarden.insight.vocabulary.result.snapshot_insight``
    reads the insight analyzer's). ``reload_successful`` says whether the last configuration
    reload applied (True before any), ``reload_success_timestamp`` when the configuration last loaded (start or
    reload, Unix s).
    """

    seq: int
    source: str
    static: NodeStatic
    poll: PollResult | None
    interval_seconds: float
    polls_total: int = 0
    poll_failures_total: int = 0
    last_success_timestamp: float | None = None
    source_up: bool = True
    down_reason: str | None = None
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    xid: dict[int, dict[int, XidTotal]] = field(default_factory=dict)
    last_up: dict[int, GpuReading] = field(default_factory=dict)
    analyses: dict[str, Any] = field(default_factory=dict)
    extra_info: dict[str, str] = field(default_factory=dict)
    reload_successful: bool = True
    reload_success_timestamp: float | None = None

    def fresh(self, now: float, max_age_seconds: float) -> bool:
        """True when the last successful poll is at most ``max_age_seconds`` old at ``now``."""
        return self.last_success_timestamp is not None and now - self.last_success_timestamp <= max_age_seconds


class SnapshotHolder(Protocol):
    """Anything that holds the latest snapshot (the poller; ``Held`` for a fixed one)."""

    @property
    def snapshot(self) -> NodeSnapshot | None:
        """The latest snapshot, None before the first."""
        ...


@dataclass(frozen=True)
class Held:
    """A SnapshotHolder of one fixed snapshot (a one-shot diagnosis, a test)."""

    snapshot: NodeSnapshot | None
