"""Polling one GPU: the cheap readings every poll, the expensive ones at a slower cadence.

The scalar readings and their cadence are declared in ``gpuwarden.catalog`` (resolved in
``gpuwarden.nvml.readings``); this module makes the calls and reads the irregular readings by hand. What each read
costs, and why each cadence was chosen, is measured in docs/performance.md.

- every poll: the declared ``poll`` readings (utilization, temperature, power, clocks, clock event reasons,
  P-state, PCIe link generation, and the cheap field values in one nvmlDeviceGetFieldValues batch), memory
  (nvmlDeviceGetMemoryInfo v2, v1 where v2 is unsupported) and processes;
- once per ``gpm_interval`` (never more often than polls): GPM metrics (nvmlGpmMetricsGet), each the average
  since the previous computation, carried between them;
- every poll too: the util.gpu sample buffer (nvmlDeviceGetSamples), the samples since the previous poll, whose mean
  is the poll's util.gpu (GpuReading.utilization_gpu_ratio): nvmlDeviceGetUtilizationRates answers the last sample
  alone (about a sixth of a second), so work whose period divides the poll period aliases to 0 or 100%;
- every ``slow_interval`` seconds, carried between reads: the declared ``slow`` readings (energy, ECC totals, PCIe
  link width, PCIe replays and the hardware slowdown durations) and remapped rows;
- once (gpuwarden.nvml.static): max clocks, thresholds; never: nvmlDeviceGetPcieThroughput (it blocks for its
  sample period), PCIe rates come from GPM.
"""

from __future__ import annotations

import time
from typing import Any

import pynvml

from gpuwarden.config import GPM_INTERVAL, SLOW_INTERVAL
from gpuwarden.model import GpuReading, GpuStatic, MigReading, ProcessReading, samples_mean
from gpuwarden.nvml.calls import Caller, GpuLost, decode, error_name, field_value
from gpuwarden.nvml.events import XidWatcher
from gpuwarden.nvml.gpm import GpmSampler
from gpuwarden.nvml.nvlink import LINK_COUNTER_SLOW_READS, LinkReader
from gpuwarden.nvml.readings import (
    FIELDS,
    POLL_CALLS,
    POLL_FIELDS,
    SLOW_CALLS,
    SLOW_FIELDS,
    PlannedCall,
    failing_readings,
    picked,
    store,
    unsupported_readings,
)
from gpuwarden.procinfo import ProcessInspector

#: Seconds of slack on the GPM and host cadences, so a poll that comes a few ms early still reads on time (a multiple
#: of the interval would not do: 0.9 x 10 s read GPM every 9 polls of 1 s).
CADENCE_SLACK = 0.05

_QUIET_NOT_FOUND = frozenset({pynvml.NVML_ERROR_NOT_FOUND})
#: Seconds between reads of per-process utilization (nvmlDeviceGetProcessUtilization is one of the slowest calls,
#: docs/performance.md; it returns every sample since the last read, so a longer gap loses nothing but resolution).
PROCESS_UTILIZATION_INTERVAL = 5.0
#: Per-process utilization, the newer call first (NVML 12.535+; the legacy one reads 0 for every process on
#: Blackwell, which HAMi-core's fix works around the same way), the legacy one where the driver or binding lacks it.
PROCESS_UTILIZATION_CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")
#: A GPU busy at least this much (util.gpu over the poll) while every process reads 0 SM utilization: the per-process
#: readings are not believed (``failing``: ``process_sm_utilization`` -> ``zero_beside_busy_gpu``) and not exported.
PROCESS_ZERO_BUSY_MIN = 0.1


class GpuPoller:
    """Reads one GPU each poll into a GpuReading (see the module doc for the cadence).

    ``slow_interval``: seconds between reads of the slow readings; ``gpm_interval``: least seconds between
    two GPM metric computations (carried in between).

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
    ) -> None:
        self.static = static
        self._handle = handle
        self._caller = caller
        self._inspector = inspector
        self._xid = xid
        self._slow_interval = slow_interval
        self._next_slow = 0.0
        self._slow: dict[str, Any] = {}
        self._fields = list(POLL_FIELDS)
        self._slow_fields = list(SLOW_FIELDS)
        self._unsupported_fields: set[int] = set()  # field ids the GPU answered NOT_SUPPORTED
        self._failing_fields: dict[int, str] = {}  # field id -> error of its last read, while it fails
        self._unsupported: tuple[tuple[int, int], list[str]] = ((-1, -1), [])  # (sizes it was made at, names)
        self._last_sample_us = int(time.time() * 1e6)
        self._last_process_sample_us = self._last_sample_us
        self._process_util: dict[int, float] = {}
        self._next_process_util = 0.0
        self._gpm_interval = gpm_interval
        self._gpm_last: dict[int | None, tuple[float, dict[str, float]]] = {}  # key -> (read at, values)
        self._gpm: GpmSampler | None = None
        if static.gpm_supported:
            try:
                self._gpm = GpmSampler(handle, caller)
            except pynvml.NVMLError as exc:
                caller.errors[("nvmlGpmSampleAlloc", error_name(exc))] += 1
        self._mig_gpm: dict[int, GpmSampler] = {}
        self._memory_v2 = True
        self._holders: dict[int, float] = {}  # pid -> start time of the processes at the last good read
        self._links: LinkReader | None = None
        if static.nvlink_link_count:  # each GPU's link counters at its own offset: 8 GPUs an eighth apart
            interval = LINK_COUNTER_SLOW_READS * slow_interval
            offset = (static.index * interval / 8) % interval
            self._links = LinkReader(handle, caller, static.nvlink_link_count, interval, offset)

    def read(self, now: float) -> GpuReading:
        """Return this poll's reading of the GPU (``now`` is the poll's Unix time)."""
        index, uuid = self.static.index, self.static.uuid
        try:
            reading = self._read(now)
        except GpuLost as exc:
            self._caller.errors[(str(exc), "gpu_is_lost")] += 1
            return GpuReading(
                index=index, uuid=uuid, timestamp=now, up=False, error="gpu_is_lost", processes=self._holders_alive()
            )
        if self._xid is not None:
            reading.xid_events = self._xid.drain(index)
        self._holders = {p.pid: p.create_time for p in reading.processes or () if p.create_time is not None}
        return reading

    def _unsupported_names(self) -> list[str]:
        """The readings this GPU never answers (``unsupported_readings``), made again only when the set of
        unsupported calls or field ids grew (each is learnt once: the first answer)."""
        calls, fields = self._caller.unsupported, self._unsupported_fields
        sizes = (len(calls), len(fields))
        if sizes != self._unsupported[0]:
            names = unsupported_readings(
                lambda attr: bool(getattr(self.static, attr)), calls, fields, "nvmlDeviceGetRemappedRows" in calls
            )
            self._unsupported = (sizes, names)
        names = list(self._unsupported[1])
        if self._links is not None:
            if self._links.errors:  # NVLink errors are reported per link: no blind spot without NVML's totals
                names = [n for n in names if not n.startswith("nvlink_errors_total:")]
            names = sorted(names + self._links.unsupported())
        return names

    def _holders_alive(self) -> list[ProcessReading] | None:
        """The processes that held the GPU at its last good read and still run (the same PID and start time, read
        from /proc; their GPU memory unknown): NVML lists no process on a lost GPU, but a job stuck on it still
        holds it. None without process inspection."""
        if self._inspector is None:
            return None
        alive = []
        for pid, started in self._holders.items():
            p = self._inspector.describe(pid, None)
            if p.create_time == started:
                alive.append(p)
        self._holders = {p.pid: self._holders[p.pid] for p in alive}
        return alive

    def _read(self, now: float) -> GpuReading:
        c, h = self._caller.call, self._handle
        r: dict[str, Any] = {"index": self.static.index, "uuid": self.static.uuid, "timestamp": now, "up": True}
        self._read_calls(POLL_CALLS, r)  # nvmlDeviceGetUtilizationRates first: a poll starts with it
        r["utilization_samples"] = self._samples()
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
        self._fields = self._read_fields(self._fields, r)
        r["gpm"] = self._read_gpm(now, self._gpm)
        if now >= self._next_slow:
            self._read_slow(now)
            self._next_slow = now + self._slow_interval
        for field, value in self._slow.items():  # carried between slow reads
            current = r.get(field)
            r[field] = {**current, **value} if isinstance(current, dict) and isinstance(value, dict) else value
        if self._links is not None:
            r["nvlink_link_up"] = dict(self._links.up)
            r["nvlink_link_errors_total"] = dict(self._links.errors)
            r["fabric"] = self._links.fabric
        util = samples_mean(r["utilization_samples"])
        r["processes"] = self._believed(self._processes(), r.get("utilization_gpu_ratio") if util is None else util)
        r["unsupported"] = self._unsupported_names()
        if self._caller.failing or self._failing_fields:
            r["failing"] = failing_readings(self._caller.failing, self._failing_fields)
        if self.static.mig_enabled:
            r["mig"] = self._mig(now)
        return GpuReading(**r)

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

    def _read_calls(self, calls: tuple[PlannedCall, ...], r: dict[str, Any]) -> None:
        """Make the planned NVML calls and store the readings of each answer into ``r``."""
        c, h, static = self._caller.call, self._handle, self.static
        for call in calls:
            if call.only_if is not None and not getattr(static, call.only_if):
                continue
            answer = c(call.name, call.resolve(), h, *call.args)
            if answer is None:
                continue
            for reading in call.readings:
                store(r, reading, picked(answer, reading))

    def _read_fields(self, fields: list[int], r: dict[str, Any]) -> list[int]:
        """Read the field values ``fields`` into ``r``; return the fields still supported."""
        if not fields:
            return fields
        values = self._caller.call("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, self._handle, fields)
        if values is None:
            error = self._caller.failing.get("nvmlDeviceGetFieldValues")
            if error is not None:  # the batch failed whole: each of its fields is failing
                self._failing_fields.update(dict.fromkeys(fields, error))
            return fields
        unsupported = []
        for fv in values:
            if fv.nvmlReturn != pynvml.NVML_SUCCESS:
                if fv.nvmlReturn in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    unsupported.append(fv.fieldId)
                else:
                    self._failing_fields[fv.fieldId] = error_name(pynvml.NVMLError(fv.nvmlReturn))
                continue
            if self._failing_fields:
                self._failing_fields.pop(fv.fieldId, None)
            value = field_value(fv)
            if value is not None:
                store(r, FIELDS[fv.fieldId], value)
        self._unsupported_fields.update(unsupported)
        return [f for f in fields if f not in unsupported] if unsupported else fields

    def _read_slow(self, now: float) -> None:
        c, h = self._caller.call, self._handle
        if self._links is not None:
            self._links.read_slow(now)
        slow: dict[str, Any] = {}
        self._slow_fields = self._read_fields(self._slow_fields, slow)
        self._read_calls(SLOW_CALLS, slow)
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

    def _listed(self) -> list[tuple[int, int | None]] | None:
        """(pid, GPU memory in bytes or None) of each compute process on the GPU, each PID once, as
        nvmlDeviceGetComputeRunningProcesses answers this poll; None when the call fails."""
        procs = self._caller.call(
            "nvmlDeviceGetComputeRunningProcesses", pynvml.nvmlDeviceGetComputeRunningProcesses, self._handle
        )
        if procs is None:
            return None
        listed: list[tuple[int, int | None]] = []
        seen = set()
        for p in procs:
            pid = int(p.pid)
            if pid in seen:
                continue
            seen.add(pid)
            used = p.usedGpuMemory
            listed.append((pid, int(used) if used is not None else None))
        return listed

    def _processes(self) -> list[ProcessReading] | None:
        if self._inspector is None:
            return None
        listed = self._listed()
        if listed is None:
            return None
        describe = self._inspector.describe
        out = [describe(pid, used) for pid, used in listed]
        if out and time.monotonic() >= self._next_process_util:
            self._next_process_util = time.monotonic() + PROCESS_UTILIZATION_INTERVAL
            self._process_util = self._process_utilization()
        util = self._process_util if out else {}
        if util:
            out = [p.model_copy(update={"sm_utilization_ratio": util[p.pid]}) if p.pid in util else p for p in out]
        return self._kept(out)

    def _believed(self, procs: list[ProcessReading] | None, util: float | None) -> list[ProcessReading] | None:
        """``procs``, without their SM utilization where every process read 0 while the GPU was busy ``util`` >=
        PROCESS_ZERO_BUSY_MIN (the legacy call on Blackwell): then the reading is failing (``process_sm_utilization``:
        ``zero_beside_busy_gpu``) rather than exported as 0."""
        zeros = bool(self._process_util) and not any(self._process_util.values())
        if zeros and util is not None and util >= PROCESS_ZERO_BUSY_MIN:
            self._caller.failing["process_sm_utilization"] = "zero_beside_busy_gpu"
            return [p.model_copy(update={"sm_utilization_ratio": None}) for p in procs or ()]
        self._caller.failing.pop("process_sm_utilization", None)
        return procs

    def _kept(self, out: list[ProcessReading]) -> list[ProcessReading]:
        """``out`` with each PID /proc does not have given its keeper (ProcessReading.kept_by): the first live
        process holding this GPU's device file open, whose user and cgroup (so its job) stand for it."""
        unknown = frozenset(p.pid for p in out if p.create_time is None and p.username is None)
        minor = self.static.minor_number
        if self._inspector is None or minor is None:
            return out
        keepers = self._inspector.keepers(minor, unknown, {p.pid for p in out})
        if not keepers or not unknown:
            return out
        k = self._inspector.describe(keepers[0], None)
        stand_in = {"kept_by": k.pid, "username": k.username, "cgroup": k.cgroup, "slurm_job_id": k.slurm_job_id,
                    "hostname_env": k.hostname_env}  # fmt: skip
        return [p.model_copy(update=stand_in) if p.pid in unknown else p for p in out]

    def _process_utilization(self) -> dict[int, float]:
        """pid -> mean SM utilization (0-1) of its samples since the last read (every PROCESS_UTILIZATION_INTERVAL;
        the values are carried in between), from the first of PROCESS_UTILIZATION_CALLS the driver and binding answer
        (nvmlDeviceGetProcessesUtilizationInfo, else nvmlDeviceGetProcessUtilization; one that answers NOT_SUPPORTED
        or FUNCTION_NOT_FOUND is not asked again). NVML answers NOT_FOUND when no process ran since then: {}. A value
        above 100% (a sentinel) is dropped."""
        samples = None
        for name in PROCESS_UTILIZATION_CALLS:
            fn = getattr(pynvml, name, None)
            if fn is None or name in self._caller.unsupported:
                continue
            samples = self._caller.call(name, fn, self._handle, self._last_process_sample_us, quiet=_QUIET_NOT_FOUND)
            if name not in self._caller.unsupported:
                break  # answered: samples, none since the last read (NOT_FOUND), or an error counted
        if not samples:
            return {}
        self._last_process_sample_us = max(self._last_process_sample_us, *(int(s.timeStamp) for s in samples))
        per: dict[int, list[float]] = {}
        for s in samples:
            if 0 <= int(s.smUtil) <= 100:
                per.setdefault(int(s.pid), []).append(int(s.smUtil) / 100)
        return {pid: sum(v) / len(v) for pid, v in per.items()}

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
                MigReading(
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


__all__ = ["GPM_INTERVAL", "SLOW_INTERVAL", "GpuPoller", "error_name", "field_value"]
