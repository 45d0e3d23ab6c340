"""Hours of a daemon's real exposition from a recorded trace, in minutes: the trace replayed through the real poller,
analyzer and collectors in the recorded time (``ReplaySource(timing="recorded")``, looping as ``serve --replay``
does), the exposition rendered every scrape interval of that time, written as OpenMetrics with timestamps for
``promtool tsdb create-blocks-from openmetrics``. The readings are the recording's (a loop of a real recording, as
the demo is); only the times are moved, to where the test wants them."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.exposition import Exposition
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource
from gpuwarden.snapshot import Held

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
#: The series the reclaim ladder and the accounting read (the rest is left out to keep the backfill small).
WANTED = ("gpu_up", "gpu_state_seconds_total", "gpu_idle_seconds_total", "gpu_diagnosis", "gpu_job_info",
          "gpu_process_job_info", "gpu_devices")  # fmt: skip


def replayed(trace: Path, labels: dict[str, str], start: float, seconds: float, every: float = 15.0,
             wanted: tuple[str, ...] = WANTED, node_name: str | None = None
             ) -> dict[tuple[str, str], list[tuple[float, str]]]:  # fmt: skip
    """The samples of ``wanted`` series of ``trace`` replayed for ``seconds`` of recorded time, rendered every
    ``every`` seconds, moved to begin at ``start`` (Unix seconds): (name, label text with ``labels`` added) -> [(time,
    value)]. ``node_name``: the node's name on ``gpu_devices`` (the daemon's ``node_name``; default the recording
    machine's host name)."""
    poller = Poller(ReplaySource(trace, timing="recorded"), 1.0, analyzers={"insight": InsightAnalyzer().prepare})
    poller.start(thread=False)
    extra = ",".join(f'{k}="{v}"' for k, v in labels.items())
    out: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    first: float | None = None
    due = 0.0
    collectors = select_collectors((), ())
    while True:
        snap = poller.snapshot
        assert snap is not None and snap.poll is not None
        now = snap.poll.timestamp
        first = now if first is None else first
        if now - first >= due:
            text = Exposition(Held(snap), collectors, CollectOptions(node_name=node_name)).render().decode()
            for line in text.splitlines():
                m = SAMPLE.match(line)
                if m is None or m.group(1) not in wanted:
                    continue
                name, inner, value = m.groups()
                key = (name, ",".join(x for x in (extra, inner or "") if x))
                out[key].append((start + (now - first), value))
            due += every
        if now - first >= seconds:
            return dict(out)
        poller.poll_once()


def openmetrics(*series: dict[tuple[str, str], list[tuple[float, str]]]) -> str:
    """The series as OpenMetrics text (timestamps in seconds), ``# EOF`` last."""
    lines = []
    for part in series:
        for (name, labels), points in sorted(part.items()):
            lines += [f"{name}{{{labels}}} {v} {t:.3f}" for t, v in points]
    return "\n".join([*lines, "# EOF", ""])
