"""The daemon's own health: build, source, polls, poll duration, freshness, NVML errors.

Always enabled: alerts on a stale or failing collection depend on it.
"""

from __future__ import annotations

import platform

from prometheus_client import ProcessCollector

from gpuwarden import __version__
from gpuwarden.catalog import HTTP_CLOSE_REASONS, Family
from gpuwarden.collectors.registry import CollectOptions, builds, new_family, new_values
from gpuwarden.families import MetricFamily
from gpuwarden.snapshot import NodeSnapshot


def _info(fam: Family, values: dict[str, str]) -> MetricFamily:
    info = new_family(fam)
    info.add_metric([], values)
    return info


def _value(fam: Family, value: float) -> MetricFamily:
    metric = new_values(fam)
    metric.add_metric([], value)
    return metric


@builds("gpuwarden_build_info")
def build_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return gpuwarden's version, Python's and nvidia-ml-py's."""
    return _info(
        fam,
        {
            "version": __version__,
            "python_version": platform.python_version(),
            "nvml_binding_version": snap.static.binding_version or "",
        },
    )


@builds("gpuwarden_gpu_hour_price")
def gpu_hour_price(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the price of one GPU-hour of each GPU model on the node (NVML's name, as gpu_info's), with its
    currency: the model's in ``gpu_hour_prices``, else ``price_per_gpu_hour``; a model with neither left out, None
    when no model is priced."""
    metric = new_values(fam)
    for model in sorted({g.name for g in snap.static.gpus}):
        price = opts.gpu_hour_prices.get(model, opts.price_per_gpu_hour)
        if price is not None:
            metric.add_metric([opts.currency, model], price)
    return metric if len(metric) else None


@builds("gpuwarden_source_info")
def source_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return the source (nvml or replay) and what describes it (the trace's name)."""
    return _info(fam, {"source": snap.source, **snap.extra_info})


@builds("gpuwarden_source_up")
def source_up(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return 1 when the last poll of the source succeeded."""
    return _value(fam, 1.0 if snap.source_up else 0.0)


@builds("gpuwarden_polls_total")
def polls(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return the polls completed."""
    return _value(fam, snap.polls_total)


@builds("gpuwarden_poll_failures_total")
def poll_failures(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return the polls that failed as a whole."""
    return _value(fam, snap.poll_failures_total)


@builds("gpuwarden_poll_interval_seconds")
def poll_interval(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return the configured poll interval, in seconds."""
    return _value(fam, snap.interval_seconds)


@builds("gpuwarden_poll_duration_seconds")
def poll_duration(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the duration of the last poll, in seconds (absent before the first)."""
    return _value(fam, snap.poll.duration_seconds) if snap.poll is not None else None


@builds("gpuwarden_last_poll_success_timestamp_seconds")
def last_success(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the Unix time of the last successful poll (absent before the first)."""
    return _value(fam, snap.last_success_timestamp) if snap.last_success_timestamp is not None else None


@builds("gpuwarden_config_last_reload_successful")
def reload_successful(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return 1 when the last reload applied (or there was none), 0 when it was refused."""
    return _value(fam, 1.0 if snap.reload_successful else 0.0)


@builds("gpuwarden_config_last_reload_success_timestamp_seconds")
def reload_timestamp(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return when the configuration last loaded, Unix seconds."""
    return _value(fam, snap.reload_success_timestamp) if snap.reload_success_timestamp is not None else None


#: prometheus_client's own reader of this process's /proc/self/stat, /proc/self/limits and /proc/self/fd (the
#: boot time read once, when it is made); kept out of any registry: the exposition asks it once a render.
_PROCESS = ProcessCollector(registry=None)


def process_values() -> dict[str, float]:
    """The standard ``process_*`` values of this process by family name (CPU seconds, virtual and resident memory in
    bytes, start time in Unix seconds, open and maximum file descriptors), as prometheus_client's ProcessCollector
    reads them; a value it cannot read (no /proc) is absent. Raises nothing."""
    try:
        families = _PROCESS.collect()
    except (OSError, ValueError):  # a limits line it cannot parse
        return {}
    return {s.name: float(s.value) for fam in families for s in fam.samples}


_process_cache: tuple[int, dict[str, float]] = (-1, {})


def _process_family(snap: NodeSnapshot, fam: Family) -> MetricFamily | None:
    """The ``process_*`` family ``fam`` (``process_values``, read once a render for the six), None when /proc lacks
    it."""
    global _process_cache
    seq, values = _process_cache
    if seq != snap.seq:
        values = process_values()
        _process_cache = (snap.seq, values)
    value = values.get(fam.name)
    return None if value is None else _value(fam, value)


for _name in (
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
):
    builds(_name)(lambda snap, opts, fam: _process_family(snap, fam))


@builds("gpuwarden_nvml_errors_total")
def nvml_errors(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return the NVML failures by call and error (the family is there, empty, while there are none)."""
    errors = new_values(fam)
    for (call, err), n in sorted(snap.errors.items()):
        errors.add_metric([call, err], n)
    return errors


@builds("gpuwarden_http_connections_closed_total")
def http_closed(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the HTTP server's closed and refused connections by reason (HttpLimits.counts), every reason from 0;
    None without a server (a collector test, a replay rendered in-process)."""
    if opts.http_closed is None:
        return None
    closed = new_values(fam)
    for reason in HTTP_CLOSE_REASONS:
        closed.add_metric([reason], opts.http_closed.get(reason, 0))
    return closed
