"""NVLink links and fabric: each link's errors by type, the fabric's state, identity and health checks.

Sources (gpuwarden.nvml.nvlink): nvmlDeviceGetNvLinkErrorCounter and Blackwell's per-link field values (every 300 s),
nvmlDeviceGetGpuFabricInfoV (at the slow cadence). ``gpu_nvlink_link_up`` is a declared family. A lost GPU keeps its
last link counters (``health_readings``): what the link did before the GPU went is what its service needs.
"""

from __future__ import annotations

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import (
    CollectOptions,
    builds,
    gpu_label_values,
    health_readings,
    new_family,
    new_values,
    readings,
)
from gpuwarden.families import MetricFamily
from gpuwarden.snapshot import NodeSnapshot

#: The fabric states a series is given for (not_supported: no fabric, no series).
FABRIC_STATES = ("not_started", "in_progress", "completed")


@builds("gpu_nvlink_link_errors_total")
def link_errors(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return each link's error counters that have counted an error, keys ``LINK:TYPE`` split into the labels
    ``link`` and ``type``: a counter still at 0 has no series (an SXM GPU has 18 links and 5 counters a link, nearly
    all 0 on a healthy one)."""
    errors = new_values(fam)
    for g in health_readings(snap):
        labels = gpu_label_values(g)
        for key, value in sorted(g.nvlink_link_errors_total.items(), key=lambda kv: _order(kv[0])):
            if not value:
                continue
            link, _, kind = key.partition(":")
            errors.add_metric([*labels, link, kind], value)
    return errors if errors else None


def _order(key: str) -> tuple[int, str]:
    link, _, kind = key.partition(":")
    return (int(link) if link.isdigit() else -1, kind)


@builds("gpu_fabric_state")
def fabric_state(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return 1 for the fabric's state (one of FABRIC_STATES), per GPU with a fabric; the other states have no
    series."""
    states = new_values(fam)
    for g in readings(snap):
        if g.fabric is not None and g.fabric.state in FABRIC_STATES:
            states.add_metric([*gpu_label_values(g), g.fabric.state], 1.0)
    return states if states else None


@builds("gpu_fabric_info")
def fabric_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the fabric's registration status, clique, cluster and health summary, per GPU with a fabric."""
    info = new_family(fam)
    for g in readings(snap):
        f = g.fabric
        if f is not None:
            fabric = {"status": f.status, "clique_id": str(f.clique_id), "cluster_uuid": f.cluster_uuid,
                      "health_summary": f.health_summary}  # fmt: skip
            info.add_metric(gpu_label_values(g), fabric)
    return info if info else None


@builds("gpu_fabric_health_problem")
def fabric_health(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return 1 per health check that reports a problem, 0 per check that reports none."""
    checks = new_values(fam)
    for g in readings(snap):
        if g.fabric is not None:
            for check, problem in sorted(g.fabric.health.items()):
                checks.add_metric([*gpu_label_values(g), check], 1.0 if problem else 0.0)
    return checks if checks else None
