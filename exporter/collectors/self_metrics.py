"""The daemon's own health: build, source, polls, poll duration, freshness, NVML errors.

Always enabled: alerts on a stale or failing collection depend on it.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from exporter import __version__
from exporter.collectors.base import CollectOptions, collector
from exporter.poller import NodeSnapshot


@collector("exporter", help="gpuwarden's own metrics: build info, polls, poll duration, freshness, NVML errors")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield the gpuwarden_* self-metrics."""
    build = InfoMetricFamily("gpuwarden_build", "gpuwarden version and runtime (value 1).")
    build.add_metric(
        [],
        {
            "version": __version__,
            "python_version": platform.python_version(),
            "nvml_binding_version": snap.static.binding_version or "",
        },
    )
    yield build
    src = InfoMetricFamily("gpuwarden_source", "Where readings come from: nvml (live) or replay (a recorded trace).")
    src.add_metric([], {"source": snap.source, **snap.extra_info})
    yield src
    yield GaugeMetricFamily(
        "gpuwarden_source_up",
        "1 when the last poll of the source succeeded.",
        value=1.0 if snap.source_up else 0.0,
    )
    yield CounterMetricFamily("gpuwarden_polls", "Polls completed.", value=snap.polls_total)
    yield CounterMetricFamily(
        "gpuwarden_poll_failures", "Polls that failed as a whole.", value=snap.poll_failures_total
    )
    yield GaugeMetricFamily(
        "gpuwarden_poll_interval_seconds", "Configured time between polls.", value=snap.interval_seconds
    )
    if snap.poll is not None:
        yield GaugeMetricFamily(
            "gpuwarden_poll_duration_seconds",
            "Duration of the last poll of every GPU.",
            value=snap.poll.duration_seconds,
        )
    if snap.last_success_timestamp is not None:
        yield GaugeMetricFamily(
            "gpuwarden_last_poll_success_timestamp_seconds",
            "Unix time of the last successful poll; alert on time() minus this.",
            value=snap.last_success_timestamp,
        )
    errors = CounterMetricFamily(
        "gpuwarden_nvml_errors", "NVML calls that failed, by call and NVML error.", labels=["call", "error"]
    )
    for (call, err), n in sorted(snap.errors.items()):
        errors.add_metric([call, err], n)
    yield errors
