"""Memory errors: ECC counters by type and counter, remapped rows by type.

Sources: nvmlDeviceGetTotalEccErrors (volatile: since the driver loaded; aggregate: lifetime) and
nvmlDeviceGetRemappedRows, both read at the slow cadence. ECC mode and the remap pending/failure flags are
declared families of ``gpuwarden.catalog``. A lost GPU keeps its last counters and flags (``health_readings``).
"""

from __future__ import annotations

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import (
    CollectOptions,
    builds,
    gpu_label_values,
    health_readings,
    new_values,
)
from gpuwarden.series import Series
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_ecc_errors_total")
def ecc_errors(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Series | None:
    """Return the ECC counters split into labels ``type`` (corrected, uncorrected) and ``counter``."""
    errors = new_values(fam)
    for g in health_readings(snap):
        labels = gpu_label_values(g)
        for key, value in sorted(g.ecc_errors_total.items()):
            etype, _, ctype = key.partition("_")
            errors.add_metric([*labels, etype, ctype], value)
    return errors if errors else None


@builds("gpu_remapped_rows_total")
def remapped_rows(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Series | None:
    """Return the rows remapped for corrected and for uncorrected errors (label ``type``)."""
    rows = new_values(fam)
    for g in health_readings(snap):
        for t in ("corrected", "uncorrected"):
            if t in g.remapped_rows:
                rows.add_metric([*gpu_label_values(g), t], g.remapped_rows[t])
    return rows if rows else None
