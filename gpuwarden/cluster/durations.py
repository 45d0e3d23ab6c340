"""Prometheus durations as the fleet commands take them (``--range 1h30m``): a leaf module, so a command that only
parses its flags (``check`` in a Slurm prolog) does not import the accounting."""

from __future__ import annotations

import re

#: A Prometheus duration, as PromQL writes ranges: units from the largest down, each at most once (30s, 15m, 1h30m,
#: 1d12h, 2w); Prometheus's own grammar (model.ParseDuration).
DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNITS = (31536000, 604800, 86400, 3600, 60, 1, 0.001)


def seconds(duration: str) -> float:
    """The seconds of a Prometheus duration (``1d`` -> 86400, ``1h30m`` -> 5400). Raises ValueError for anything
    else (units out of order or repeated, no unit, zero)."""
    m = DURATION.match(duration) if duration else None
    total = sum(int(n) * unit for n, unit in zip(m.groups(), _UNITS, strict=True) if n) if m else 0
    if not total:
        raise ValueError(f"not a duration: {duration!r} (e.g. 30m, 1h30m, 6h, 1d, 2w)")
    return total
