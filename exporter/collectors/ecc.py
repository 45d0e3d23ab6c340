"""Memory errors: ECC counters and row remapping.

Sources: nvmlDeviceGetEccMode (once), nvmlDeviceGetTotalEccErrors (volatile: since the driver loaded;
aggregate: lifetime) and nvmlDeviceGetRemappedRows, both read at the slow cadence.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, counter, gauge, gpu_label_values, readings, static_gauge
from exporter.poller import NodeSnapshot


@collector("ecc", help="ECC mode and error counters, remapped rows, row-remap pending/failure")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_ecc_enabled, gpu_ecc_errors_total{type,counter}, gpu_remapped_rows_total{type},
    gpu_row_remap_pending and gpu_row_remap_failure."""
    mode = static_gauge(snap, "gpu_ecc_enabled", "1 when ECC is enabled on the GPU.", lambda s: s.ecc_enabled)
    if mode is not None:
        yield mode
    errors = counter(
        "gpu_ecc_errors",
        "ECC errors by type (corrected, uncorrected); counter volatile counts since the driver loaded, aggregate "
        "over the GPU's life.",
        ["type", "counter"],
    )
    rows = counter("gpu_remapped_rows", "Rows remapped because of corrected or uncorrected errors.", ["type"])
    pending = gauge("gpu_row_remap_pending", "1 when a row remap is pending: the GPU needs a reset to apply it.")
    failure = gauge("gpu_row_remap_failure", "1 when a row remap failed: the GPU should be serviced.")
    for g in readings(snap):
        labels = gpu_label_values(g)
        for key, value in sorted(g.ecc_errors_total.items()):
            etype, _, ctype = key.partition("_")
            errors.add_metric([*labels, etype, ctype], value)
        rr = g.remapped_rows
        for t in ("corrected", "uncorrected"):
            if t in rr:
                rows.add_metric([*labels, t], rr[t])
        if "pending" in rr:
            pending.add_metric(labels, rr["pending"])
        if "failure" in rr:
            failure.add_metric(labels, rr["failure"])
    for fam in (errors, rows, pending, failure):
        if fam.samples:
            yield fam
