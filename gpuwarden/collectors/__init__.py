"""Collectors: the families of each metric domain, declared in ``gpuwarden.catalog``.

Families that show one reading need no code; the modules imported here build the hand-written ones and register
their builders on import. ``collect(name, snapshot, options)`` yields one collector's families.
"""

from gpuwarden.collectors import (  # noqa: F401 - imported for registration
    clock_events,
    device,
    ecc,
    exporter,
    gpm,
    insight,
    mig,
    nvlink,
    processes,
    xid,
)
from gpuwarden.collectors.registry import CollectOptions, collect, missing_builders

__all__ = ["CollectOptions", "collect", "missing_builders"]
