"""XID errors as counters per code, from NVML events (nvmlEventTypeXidCriticalError).

Counts start when the daemon starts. The codes the alert rules watch are exported at 0 from the first poll, so the
first occurrence is an increase that ``increase()`` sees; other codes appear when they first occur. A lost GPU keeps
its counts (XID 79 is how it got lost). The codes and their tiers follow NVIDIA's XID catalog (docs/runbook.md):
48 double-bit ECC, 62 internal micro-controller halt, 63/64 row remap event/failure, 74 NVLink, 79 fallen off the
bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP RPC timeout/error, 154 recovery
action changed.
"""

from __future__ import annotations

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import CollectOptions, builds, gpu_label_values, gpu_rows, new_values
from gpuwarden.series import Series
from gpuwarden.snapshot import NodeSnapshot

#: XID codes exported at 0 before they ever occur.
CRITICAL_XIDS = (48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154)
_CRITICAL_KEYS = tuple(str(code) for code in sorted(CRITICAL_XIDS))
_CRITICAL_ZEROS = (0.0,) * len(CRITICAL_XIDS)


@builds("gpu_xid_errors_total")
def xid_errors(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Series | None:
    """Return the XID count per code and GPU since start (the critical codes at 0 before they occur)."""
    total = new_values(fam)
    for g in snap.poll.gpus if snap.poll is not None else ():
        seen = snap.xid.get(g.index)
        if not seen:  # no XID on this GPU since start: the critical codes at 0, the same rows at every render
            total.labels.extend(gpu_rows(g.index, g.uuid, _CRITICAL_KEYS))
            total.numbers.extend(_CRITICAL_ZEROS)
            continue
        for code in sorted(set(CRITICAL_XIDS) | set(seen)):
            t = seen.get(code)
            total.add_metric([*gpu_label_values(g), str(code)], t.count if t else 0)
    return total if total else None


@builds("gpu_xid_last_event_timestamp_seconds")
def xid_last(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Series | None:
    """Return the Unix time of the last XID of each code that occurred, per GPU."""
    last = new_values(fam)
    for g in snap.poll.gpus if snap.poll is not None else ():
        for code, t in sorted(snap.xid.get(g.index, {}).items()):
            last.add_metric([*gpu_label_values(g), str(code)], t.last_timestamp)
    return last if last else None
