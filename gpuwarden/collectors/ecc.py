"""Memory errors: ECC counters by type and counter, remapped rows by type.

Sources: nvmlDeviceGetTotalEccErrors (volatile: since the driver loaded; aggregate: lifetime) and
nvmlDeviceGetRemappedRows, both read at the slow cadence. ECC mode and the remap pending/failure flags are
declared families of ``gpuwarden.catalog``. A lost GPU keeps its last counters and flags (``health_readings``).
"""

from __future__ import annotations

import functools

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import (
    CollectOptions,
    builds,
    gpu_key_rows,
    gpu_rows,
    health_readings,
    new_values,
)
from gpuwarden.families import MetricFamily
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_ecc_errors_total")
def ecc_errors(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the ECC counters split into labels ``type`` (corrected, uncorrected) and ``counter``."""
    errors = new_values(fam)
    for g in health_readings(snap):
        keys = tuple(sorted(g.ecc_errors_total))
        errors.labels.extend(gpu_key_rows(g.index, g.uuid, _split(keys)))
        errors.numbers.extend([float(g.ecc_errors_total[k]) for k in keys])
    return errors if errors else None


@functools.lru_cache(maxsize=64)
def _split(keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Each ECC key as its ``type`` and ``counter`` labels: ``corrected_volatile`` -> (``corrected``,
    ``volatile``)."""
    return tuple((k.partition("_")[0], k.partition("_")[2]) for k in keys)


@builds("gpu_remapped_rows_total")
def remapped_rows(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the rows remapped for corrected and for uncorrected errors (label ``type``)."""
    rows = new_values(fam)
    for g in health_readings(snap):
        kinds = tuple(t for t in ("corrected", "uncorrected") if t in g.remapped_rows)
        if not kinds:
            continue
        rows.labels.extend(gpu_rows(g.index, g.uuid, kinds))
        rows.numbers.extend([float(g.remapped_rows[t]) for t in kinds])
    return rows if rows else None
