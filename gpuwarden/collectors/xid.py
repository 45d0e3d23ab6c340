"""XID errors as counters per code, from NVML events (nvmlEventTypeXidCriticalError).

Counts start when the daemon starts. A code has series only once it has occurred on the GPU (a pre-made zero for
every code an alert watches would cost a dozen series a GPU for nothing): the alert rules read the last event's time
(``gpu_xid_last_event_timestamp_seconds``), which a first occurrence sets, and the fleet commands count a code's first
appearance whole. A lost GPU keeps its counts (XID 79 is how it got lost). The codes and their tiers follow NVIDIA's
XID catalog (docs/runbook.md): 48 double-bit ECC, 62 internal micro-controller halt, 63/64 row remap event/failure, 74
NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP RPC
timeout/error, 154 recovery action changed.
"""

from __future__ import annotations

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import CollectOptions, builds, gpu_label_values, new_values
from gpuwarden.families import MetricFamily
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_xid_errors_total")
def xid_errors(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the XID count per code and GPU since start, for the codes that occurred."""
    total = new_values(fam)
    for g in snap.poll.gpus if snap.poll is not None else ():
        for code, t in sorted(snap.xid.get(g.index, {}).items()):
            total.add_metric([*gpu_label_values(g), str(code)], t.count)
    return total if total else None


@builds("gpu_xid_last_event_timestamp_seconds")
def xid_last(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the Unix time of the last XID of each code that occurred, per GPU."""
    last = new_values(fam)
    for g in snap.poll.gpus if snap.poll is not None else ():
        for code, t in sorted(snap.xid.get(g.index, {}).items()):
            last.add_metric([*gpu_label_values(g), str(code)], t.last_timestamp)
    return last if last else None
