"""The catalogue's scalar readings resolved against pynvml: which NVML calls a poll makes, and how each answer
becomes a reading.

``POLL_CALLS`` and ``SLOW_CALLS`` group the declared readings (``gpuwarden.catalog.READINGS``) by NVML function
and arguments, so a function that gives several readings (nvmlDeviceGetUtilizationRates: util.gpu and
util.memory) is called once a poll. ``POLL_FIELDS`` and ``SLOW_FIELDS`` are the field ids read in one
nvmlDeviceGetFieldValues batch each. Functions are looked up in ``pynvml`` at call time (``function``), so a test
that replaces them sees its replacements called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpuwarden.catalog import READINGS, Cadence, Reading


@dataclass(frozen=True)
class PlannedCall:
    """One NVML function call of a poll and the readings its answer holds.

    ``name`` is what failures are counted under; ``function`` the pynvml function's name; ``args`` the resolved
    constants passed after the device handle; ``only_if`` a GpuStatic attribute that must be true to call it.
    """

    name: str
    function: str
    args: tuple[Any, ...]
    readings: tuple[Reading, ...]
    only_if: str | None

    def resolve(self) -> Callable[..., Any]:
        """Return the pynvml function (looked up now). Raises AttributeError where the binding lacks it."""
        fn: Callable[..., Any] = getattr(pynvml, self.function)
        return fn


def _plan(cadence: Cadence) -> tuple[PlannedCall, ...]:
    groups: dict[tuple[str, tuple[str, ...]], list[Reading]] = {}
    for r in READINGS:
        if r.cadence == cadence and not r.is_field_value:
            groups.setdefault((r.call, r.args), []).append(r)
    return tuple(
        PlannedCall(
            name=rs[0].call_name,
            function=call,
            args=tuple(getattr(pynvml, a) for a in args),
            readings=tuple(rs),
            only_if=rs[0].only_if,
        )
        for (call, args), rs in groups.items()
    )


POLL_CALLS = _plan("poll")
SLOW_CALLS = _plan("slow")

#: Field id -> the reading it gives.
FIELDS: dict[int, Reading] = {getattr(pynvml, r.call): r for r in READINGS if r.is_field_value}
POLL_FIELDS = [fid for fid, r in FIELDS.items() if r.cadence == "poll"]
SLOW_FIELDS = [fid for fid, r in FIELDS.items() if r.cadence == "slow"]


def picked(answer: Any, reading: Reading) -> Any:
    """Return the part of an NVML answer that holds ``reading`` (the attribute or item its ``pick`` names)."""
    if reading.pick is None:
        return answer
    if isinstance(reading.pick, str):
        return getattr(answer, reading.pick)
    return answer[reading.pick]


def store(values: dict[str, Any], reading: Reading, raw: float | int) -> None:
    """Put the NVML number ``raw`` of ``reading``, scaled to base units, into ``values`` (a GpuReading's fields)."""
    value: float | int = int(raw) if reading.integer else float(raw) * reading.scale
    if reading.key is None:
        values[reading.field] = value
    else:
        values.setdefault(reading.field, {})[reading.key] = value


def reading_name(r: Reading) -> str:
    """The name of reading ``r`` in ``GpuReading.unsupported``: its GpuReading field, with its key (``field:key``)
    where the field holds one value per key."""
    return r.field if r.key is None else f"{r.field}:{r.key}"


def unsupported_readings(
    static_has: Callable[[str], bool], calls: set[str], fields: set[int], remapped_rows: bool
) -> list[str]:
    """Return the names (``reading_name``) of the readings a GPU never answers, sorted: those whose NVML call is in
    ``calls`` (the Caller's ``unsupported``: NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND) or whose field id is in
    ``fields`` (answered NOT_SUPPORTED in nvmlDeviceGetFieldValues), among those asked of it (``static_has``: the
    GpuStatic attribute a reading needs, ``only_if``); ``remapped_rows`` when nvmlDeviceGetRemappedRows is
    unsupported. Raises nothing."""
    out = {
        reading_name(r)
        for r in READINGS
        if (r.only_if is None or static_has(r.only_if))
        and ((getattr(pynvml, r.call) in fields) if r.is_field_value else (r.call_name in calls))
    }
    if remapped_rows:
        out.add("remapped_rows")
    return sorted(out)


#: Calls that are not declared readings -> the readings they give (GpuReading fields), for ``failing_readings``.
_CALL_READINGS: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetMemoryInfo_v2": ("memory_used_bytes",),
    "nvmlDeviceGetMemoryInfo": ("memory_used_bytes",),
    "nvmlDeviceGetSamples": ("utilization_samples",),
    "nvmlDeviceGetRemappedRows": ("remapped_rows",),
    "nvmlDeviceGetComputeRunningProcesses": ("processes",),
    "nvmlGpmSampleGet": ("gpm",),
    "nvmlGpmMetricsGet": ("gpm",),
    "nvmlDeviceGetNvLinkState": ("nvlink_link_up",),
    "nvmlDeviceGetGpuFabricInfoV": ("fabric",),
    "nvmlDeviceGetFieldValues(nvlink links)": ("nvlink_link_errors_total",),
}
_PLANNED_READINGS: dict[str, tuple[str, ...]] = {
    call.name: tuple(reading_name(r) for r in call.readings) for call in (*POLL_CALLS, *SLOW_CALLS)
}


def failing_readings(failing_calls: dict[str, str], failing_fields: dict[int, str]) -> dict[str, str]:
    """The readings a GPU's last attempt failed to read (reading name as ``reading_name`` -> NVML error name), from
    its Caller's ``failing`` calls and the field ids whose last value came with an error: what is missing or stale
    (a slow reading carries its last good value) now, not what the GPU never answers (``unsupported_readings``).
    A call that gives no declared reading is named by itself. Raises nothing."""
    out: dict[str, str] = {}
    for call, error in failing_calls.items():
        if call == "nvmlDeviceGetFieldValues":
            continue  # a batch that failed whole: its fields are named below by the poller
        base = call.partition("(")[0]
        names = (
            _PLANNED_READINGS.get(call)
            or _CALL_READINGS.get(call)
            or (("nvlink_link_errors_total",) if base == "nvmlDeviceGetNvLinkErrorCounter" else (call,))
        )
        for name in names:
            out[name] = error
    for fid, error in failing_fields.items():
        reading = FIELDS.get(fid)
        if reading is not None:
            out[reading_name(reading)] = error
    return dict(sorted(out.items()))
