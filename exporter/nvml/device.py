"""Polling one GPU: the cheap readings every poll, the expensive ones at a slower cadence.

Costs measured on an H100 (shared/reference/h100-nvml-facts.md, docs/bench/h100-nvml-costs.json) decide
the cadence:

- every poll (a few µs each): utilization, memory, temperature, power, clocks, clock event reasons,
  P-state, PCIe link generation, processes, and the cheap field values (FAST_FIELDS: memory temperature and the
  software clock-event duration counters, ~3 µs);
- once per ``gpm_interval`` (config ``gpm_interval_seconds``, default 10 s; never more often than polls): GPM
  metrics (nvmlGpmMetricsGet, ~1.3 ms of CPU per call on an H100 whether it computes 1 or 13 metrics), each the
  average since the previous computation, carried between them. The insight verdicts of every recorded
  scenario are the same with GPM held for 10 s as for 1 s (they use 60-300 s windows);
- only when polls are at least SAMPLES_MIN_GAP (2 s) apart: the util.gpu sample buffer
  (nvmlDeviceGetSamples, ~2.8 ms of CPU whatever it returns, the largest cost of a 1 s poll). At faster polls
  nvmlDeviceGetUtilizationRates, read every poll, is enough: at 0.1 s it resolves the sample period (1/6 s
  on an H100) by itself, and at 1 s the insight verdicts and starved ratios of every recorded scenario are
  the same without the buffer (within 0.01; tests/test_insight_without_samples.py);
- every ``slow_interval`` seconds (default SLOW_INTERVAL, 30 s), carried between reads: the energy counter
  (~3-5 ms), ECC totals, remapped rows, the PCIe link width (~26 µs, a hundred times the other link reads), and
  the expensive field values (SLOW_FIELDS: PCIe replays ~150 µs, hardware thermal / power-brake slowdown
  durations ~570 µs each);
- once (exporter.nvml.static): max clocks, thresholds; never: nvmlDeviceGetPcieThroughput (a 20 ms block),
  PCIe rates come from GPM.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pynvml
from pydantic_core import PydanticUndefined

from exporter.model import GpuReading, GpuStatic, MigReading, ProcessReading
from exporter.nvml.calls import Caller, GpuLost, decode, error_name
from exporter.nvml.events import XidWatcher
from exporter.nvml.gpm import GpmSampler
from exporter.nvml.static import CLOCK_TYPES
from exporter.procinfo import ProcessInspector

_NS = 1e-9

#: Field values read every poll (each ~3 µs on an H100): field id -> (reading, scale). Durations are in ns.
FAST_FIELDS: dict[int, tuple[str, float]] = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: ("temperature_memory", 1.0),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: ("event:sw_power_cap", _NS),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: ("event:sync_boost", _NS),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: ("event:sw_thermal_slowdown", _NS),
}

#: Field values read every ``slow_interval`` (measured on an H100: PCIe replays ~150 µs, the two hardware
#: slowdown durations ~570 µs each; one such field makes the whole batch that slow).
SLOW_FIELDS: dict[int, tuple[str, float]] = {
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: ("pcie_replay", 1.0),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: ("event:hw_thermal_slowdown", _NS),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: ("event:hw_power_brake_slowdown", _NS),
}

_ALL_FIELDS = {**FAST_FIELDS, **SLOW_FIELDS}

#: The util.gpu sample buffer is read only when polls are at least this many seconds apart (see module doc).
SAMPLES_MIN_GAP = 2.0

#: Seconds between reads of the slow readings by default (energy ~3-5 ms of CPU a read on an H100; ECC, remapped
#: rows, PCIe link width and replays, hardware slowdown durations). These are counters and states that alerts read
#: over minutes (dcgm-exporter reads everything every 30 s by default); the energy counter is cumulative in NVML,
#: so reading it less often loses no energy, only time resolution (power draw itself is read every poll).
SLOW_INTERVAL = 30.0

#: GPM metrics are computed at most once per this many seconds by default (nvmlGpmMetricsGet ~1.3 ms).
GPM_INTERVAL = 10.0

#: Seconds of slack on the GPM and host cadences, so a poll that comes a few ms early still reads on time (a multiple
#: of the interval would not do: 0.9 x 10 s read GPM every 9 polls of 1 s).
CADENCE_SLACK = 0.05

_ECC = {
    "corrected_volatile": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    "uncorrected_volatile": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    "corrected_aggregate": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    "uncorrected_aggregate": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
}

_QUIET_NOT_FOUND = frozenset({pynvml.NVML_ERROR_NOT_FOUND})

# GpuReading's defaults, resolved once. pydantic's model_construct resolves a missing field's default_factory
# through inspect.signature on every call (about 20 µs a field, 190 µs a reading with pydantic 2.13): fill them
# in here and pass the fields actually read as _fields_set, which gives the same model, fields set included.
_READING_DEFAULTS = {
    name: f.default
    for name, f in GpuReading.model_fields.items()
    if f.default_factory is None and f.default is not PydanticUndefined
}
_READING_FACTORIES = {
    name: f.default_factory for name, f in GpuReading.model_fields.items() if f.default_factory is not None
}


def construct_reading(values: dict[str, Any]) -> GpuReading:
    """Return ``GpuReading.model_construct(**values)`` (same model and fields set), without its per-call cost."""
    full = dict(_READING_DEFAULTS)
    for name, factory in _READING_FACTORIES.items():
        if name not in values:
            full[name] = factory()  # type: ignore[call-arg]
    full.update(values)
    return GpuReading.model_construct(_fields_set=set(values), **full)


def field_value(fv: Any) -> float | int | None:
    """Return the number held by one nvmlFieldValue_t according to its valueType, None if unknown (or a double
    that is NaN or infinite)."""
    vt, v = fv.valueType, fv.value
    if vt == pynvml.NVML_VALUE_TYPE_DOUBLE:
        d = float(v.dVal)
        return d if math.isfinite(d) else None
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(v.uiVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(v.ulVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return int(v.ullVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(v.sllVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return int(v.siVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return int(v.usVal)
    return None


class GpuPoller:
    """Reads one GPU each poll into a GpuReading (see the module doc for the cadence).

    ``slow_interval``: seconds between reads of the slow readings; ``gpm_interval``: least seconds between
    two GPM metric computations (carried in between); ``samples_min_gap``: least seconds since the previous
    poll for the util.gpu sample buffer to be read.

    Raises nothing: a GPU that answers NVML_ERROR_GPU_IS_LOST is returned with ``up=False``; other
    failures leave the reading None and are counted by the shared Caller.
    """

    def __init__(
        self,
        static: GpuStatic,
        handle: Any,
        caller: Caller,
        inspector: ProcessInspector | None,
        xid: XidWatcher | None,
        slow_interval: float,
        gpm_interval: float = GPM_INTERVAL,
        samples_min_gap: float = SAMPLES_MIN_GAP,
    ) -> None:
        self.static = static
        self._handle = handle
        self._caller = caller
        self._inspector = inspector
        self._xid = xid
        self._slow_interval = slow_interval
        self._next_slow = 0.0
        self._slow: dict[str, Any] = {}
        self._fields = list(FAST_FIELDS)
        self._slow_fields = list(SLOW_FIELDS)
        self._last_sample_us = int(time.time() * 1e6)
        self._last_read: float | None = None
        self._gpm_interval = gpm_interval
        self._samples_min_gap = samples_min_gap
        self._gpm_last: dict[int | None, tuple[float, dict[str, float]]] = {}  # key -> (read at, values)
        self._gpm: GpmSampler | None = None
        if static.gpm_supported:
            try:
                self._gpm = GpmSampler(handle, caller)
            except pynvml.NVMLError as exc:
                caller.errors[("nvmlGpmSampleAlloc", error_name(exc))] += 1
        self._mig_gpm: dict[int, GpmSampler] = {}
        self._memory_v2 = True

    def read(self, now: float) -> GpuReading:
        """Return this poll's reading of the GPU (``now`` is the poll's Unix time)."""
        index, uuid = self.static.index, self.static.uuid
        try:
            reading = self._read(now)
        except GpuLost as exc:
            self._caller.errors[(str(exc), "gpu_is_lost")] += 1
            return construct_reading(
                {"index": index, "uuid": uuid, "timestamp": now, "up": False, "error": "gpu_is_lost"}
            )
        if self._xid is not None:
            reading.xid_events = self._xid.drain(index)
        return reading

    def _read(self, now: float) -> GpuReading:
        c, h = self._caller.call, self._handle
        r: dict[str, Any] = {"index": self.static.index, "uuid": self.static.uuid, "timestamp": now, "up": True}
        util = c("nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r["utilization_gpu_ratio"] = util.gpu / 100.0
            r["utilization_memory_ratio"] = util.memory / 100.0
        previous, self._last_read = self._last_read, now
        if previous is None or now - previous >= self._samples_min_gap:
            r["utilization_samples"] = self._samples()
        else:
            self._last_sample_us = int(now * 1e6)
        mem = None
        if self._memory_v2:
            mem = c("nvmlDeviceGetMemoryInfo_v2", pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
            if mem is None and "nvmlDeviceGetMemoryInfo_v2" in self._caller.unsupported:
                self._memory_v2 = False
        if mem is None and not self._memory_v2:
            mem = c("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            r["memory_total_bytes"] = int(mem.total)
            r["memory_used_bytes"] = int(mem.used)
            r["memory_free_bytes"] = int(mem.free)
            reserved = getattr(mem, "reserved", None)
            if reserved is not None:
                r["memory_reserved_bytes"] = int(reserved)
        temp = c("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            r["temperature_gpu_celsius"] = float(temp)
        power = c("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            r["power_usage_watts"] = power / 1000.0
        limit = c("nvmlDeviceGetEnforcedPowerLimit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit is not None:
            r["power_limit_watts"] = limit / 1000.0
        fan = c("nvmlDeviceGetFanSpeed", pynvml.nvmlDeviceGetFanSpeed, h)
        if fan is not None:
            r["fan_speed_ratio"] = fan / 100.0
        clocks: dict[str, float] = {}
        for domain, ctype in CLOCK_TYPES.items():
            mhz = c(f"nvmlDeviceGetClockInfo({domain})", pynvml.nvmlDeviceGetClockInfo, h, ctype)
            if mhz is not None:
                clocks[domain] = float(mhz) * 1e6
        r["clock_hertz"] = clocks
        r["clock_event_reasons"] = c(
            "nvmlDeviceGetCurrentClocksEventReasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons, h
        )
        r["performance_state"] = c("nvmlDeviceGetPerformanceState", pynvml.nvmlDeviceGetPerformanceState, h)
        r["pcie_generation"] = c("nvmlDeviceGetCurrPcieLinkGeneration", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
        events: dict[str, float] = {}
        self._fields = self._read_fields(self._fields, r, events)
        r["gpm"] = self._read_gpm(now, self._gpm)
        if now >= self._next_slow:
            self._read_slow()
            self._next_slow = now + self._slow_interval
        events.update(self._slow.get("clock_event_seconds_total", {}))
        r.update(self._slow)
        r["clock_event_seconds_total"] = events
        r["processes"] = self._processes()
        if self.static.mig_enabled:
            r["mig"] = self._mig(now)
        return construct_reading(r)

    def _samples(self) -> list[tuple[float, float]]:
        got = self._caller.call(
            "nvmlDeviceGetSamples",
            pynvml.nvmlDeviceGetSamples,
            self._handle,
            pynvml.NVML_GPU_UTILIZATION_SAMPLES,
            self._last_sample_us,
            quiet=_QUIET_NOT_FOUND,
        )
        if not got:
            return []
        out = []
        last = self._last_sample_us
        for s in got[1]:
            ts = int(s.timeStamp)
            if ts <= self._last_sample_us:
                continue
            out.append((ts / 1e6, s.sampleValue.uiVal / 100.0))
            last = max(last, ts)
        self._last_sample_us = last
        return out

    def _read_gpm(self, now: float, sampler: GpmSampler | None, key: int | None = None) -> dict[str, float]:
        """GPM metrics of ``sampler`` (the GPU's, or MIG GPU instance ``key``'s) over the time since its last
        read, read at most once per ``gpm_interval`` and carried in between."""
        if sampler is None:
            return {}
        last = self._gpm_last.get(key)
        if last is not None and now - last[0] < self._gpm_interval - CADENCE_SLACK:
            return last[1]
        values = sampler.read()
        self._gpm_last[key] = (now, values)
        return values

    def _read_fields(self, fields: list[int], r: dict[str, Any], events: dict[str, float]) -> list[int]:
        """Read ``fields`` into ``r`` (clock event durations into ``events``); return the fields still supported."""
        if not fields:
            return fields
        values = self._caller.call("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, self._handle, fields)
        if values is None:
            return fields
        unsupported = []
        for fv in values:
            key, scale = _ALL_FIELDS[fv.fieldId]
            if fv.nvmlReturn != pynvml.NVML_SUCCESS:
                if fv.nvmlReturn in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    unsupported.append(fv.fieldId)
                continue
            value = field_value(fv)
            if value is None:
                continue
            if key == "temperature_memory":
                r["temperature_memory_celsius"] = float(value)
            elif key == "pcie_replay":
                r["pcie_replay_total"] = int(value)
            else:
                events[key.removeprefix("event:")] = value * scale
        return [f for f in fields if f not in unsupported] if unsupported else fields

    def _read_slow(self) -> None:
        c, h = self._caller.call, self._handle
        slow: dict[str, Any] = {}
        events: dict[str, float] = {}
        self._slow_fields = self._read_fields(self._slow_fields, slow, events)
        if events:
            slow["clock_event_seconds_total"] = events
        width = c("nvmlDeviceGetCurrPcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)  # ~26 µs
        if width is not None:
            slow["pcie_width"] = width
        energy = c("nvmlDeviceGetTotalEnergyConsumption", pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        if energy is not None:
            slow["energy_joules_total"] = energy / 1000.0
        if self.static.ecc_enabled:
            ecc: dict[str, int] = {}
            for key, (etype, ctype) in _ECC.items():
                v = c(f"nvmlDeviceGetTotalEccErrors({key})", pynvml.nvmlDeviceGetTotalEccErrors, h, etype, ctype)
                if v is not None:
                    ecc[key] = int(v)
            slow["ecc_errors_total"] = ecc
        rows = c("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corrected, uncorrected, pending, failure = rows
            slow["remapped_rows"] = {
                "corrected": int(corrected),
                "uncorrected": int(uncorrected),
                "pending": int(bool(pending)),
                "failure": int(bool(failure)),
            }
        # Keep the last good value of a slow reading when this read failed.
        for key, value in slow.items():
            self._slow[key] = value

    def _processes(self) -> list[ProcessReading] | None:
        if self._inspector is None:
            return None
        procs = self._caller.call(
            "nvmlDeviceGetComputeRunningProcesses", pynvml.nvmlDeviceGetComputeRunningProcesses, self._handle
        )
        if procs is None:
            return None
        out = []
        seen = set()
        for p in procs:
            pid = int(p.pid)
            if pid in seen:
                continue
            seen.add(pid)
            used = p.usedGpuMemory
            out.append(self._inspector.describe(pid, int(used) if used is not None else None))
        return out

    def _mig(self, now: float) -> list[MigReading]:
        c, h = self._caller.call, self._handle
        count = c("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        out = []
        for i in range(count):
            mh = c(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                h,
                i,
                quiet=_QUIET_NOT_FOUND,
            )
            if mh is None:
                continue
            uuid = c("nvmlDeviceGetUUID(mig)", pynvml.nvmlDeviceGetUUID, mh)
            gi = c("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mh)
            if uuid is None or gi is None:
                continue
            ci = c("nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mh)
            mem = c("nvmlDeviceGetMemoryInfo(mig)", pynvml.nvmlDeviceGetMemoryInfo, mh)
            gpm: dict[str, float] = {}
            if self.static.gpm_supported:
                sampler = self._mig_gpm.get(gi)
                if sampler is None:
                    sampler = self._mig_gpm[gi] = GpmSampler(h, self._caller, gpu_instance_id=gi)
                gpm = self._read_gpm(now, sampler, gi)
            out.append(
                MigReading.model_construct(
                    uuid=decode(uuid),
                    gpu_instance_id=int(gi),
                    compute_instance_id=int(ci) if ci is not None else None,
                    memory_total_bytes=int(mem.total) if mem is not None else None,
                    memory_used_bytes=int(mem.used) if mem is not None else None,
                    gpm=gpm,
                )
            )
        return out

    def close(self) -> None:
        """Free the GPM samples."""
        for s in [self._gpm, *self._mig_gpm.values()]:
            if s is not None:
                s.close()


__all__ = ["GpuPoller", "construct_reading", "error_name", "field_value"]
