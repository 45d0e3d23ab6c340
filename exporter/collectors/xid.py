"""XID errors as counters per code, from NVML events (nvmlEventTypeXidCriticalError).

Counts start when the daemon starts. The critical codes that alerts watch are exported at 0 from the
first poll, so the first occurrence is an increase that ``increase()`` sees; other codes appear when
they first occur. Codes: NVIDIA's XID catalog (48 DBE, 63/64 row remap, 74 NVLink, 79 fallen off the
bus, 92 high SBE rate, 94/95 contained/uncontained ECC, 119/120 GSP).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, counter, gauge, gpu_label_values, readings
from exporter.poller import NodeSnapshot

#: XID codes exported at 0 before they ever occur.
CRITICAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)


@collector("xid", help="XID error counters per code and last event time (NVML events)")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_xid_errors_total{xid} and gpu_xid_last_event_timestamp_seconds{xid}."""
    total = counter(
        "gpu_xid_errors", "XID errors reported by the driver since gpuwarden started, by XID code.", ["xid"]
    )
    last = gauge("gpu_xid_last_event_timestamp_seconds", "Unix time of the last XID error of this code.", ["xid"])
    for g in readings(snap):
        labels = gpu_label_values(g)
        seen = snap.xid.get(g.index, {})
        for code in sorted(set(CRITICAL_XIDS) | set(seen)):
            t = seen.get(code)
            total.add_metric([*labels, str(code)], t.count if t else 0)
            if t:
                last.add_metric([*labels, str(code)], t.last_timestamp)
    if total.samples:
        yield total
    if last.samples:
        yield last
