"""A fake NVML fed by a real recorded trace, with switches that inject the faults real GPUs have.

``FakeNvml(path)`` reads a trace (``gpuwarden.trace.read_trace``) and answers every pynvml function the NVML
layer calls (``gpuwarden/nvml/static.py``, ``device.py``, ``gpm.py``, ``events.py``, ``source.py``) with
values shaped as pynvml returns them - its own ctypes structs (``c_nvmlUtilization_t``,
``c_nvmlMemory_v2_t``, ``c_nvmlFieldValue_t`` arrays, ``c_nvmlSample_t`` lists, the GPM request filled in
place, ``c_nvmlEventData_t``), ``nvmlFriendlyObject`` processes, tuples and ints - in NVML's own units
(percent, milliwatts, millijoules, MHz, nanoseconds, MiB/s), so the real NVML layer converts them back.
``install(monkeypatch)`` replaces the functions in the ``pynvml`` module for one test.

Each device keeps its own cursor into the trace: ``nvmlDeviceGetUtilizationRates`` (the first call of a
GPU's poll) moves it to the next recorded poll, looping, and every later call of that poll answers from
that record; utilization samples are re-stamped to the current time.

Fault switches (all thread-safe, all may be flipped while a daemon runs):

* ``lose(index, from_poll=None)`` - every call on that GPU raises NVML_ERROR_GPU_IS_LOST from its poll
  ``from_poll`` (1-based; default: its next poll) on; ``restore(index)`` brings it back.
* ``hold(index, pids)`` - the GPU lists these PIDs (processes of this machine, 1 GiB each) instead of the
  recorded ones, so /proc answers for them.
* ``hang(name)`` - the named function blocks (on a threading.Event) until ``release(name)``;
  ``entered(name)`` is an Event set once a caller is blocked in it.
* ``init_error = code`` - nvmlInit raises NVMLError(code) (DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, ...).
* ``unload(code)`` - a driver reload: every call raises ``code`` (UNINITIALIZED, LIB_RM_VERSION_MISMATCH,
  ...) and nvmlInit raises DRIVER_NOT_LOADED, until ``load()``; after that nvmlInit works again and hands out
  new handles (the old ones answer UNINITIALIZED), as a re-initialised library does.
* ``inject_xid(index, code)`` - an XID event that nvmlEventSetWait_v2 returns for that GPU.

``calls`` counts every call by function name (``calls["nvmlShutdown"]``).
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuwarden.catalog import CLOCK_DOMAINS, GPM_METRICS, TEMPERATURE_THRESHOLDS, Reading
from gpuwarden.model import GpuReading, GpuStatic, ProcessReading
from gpuwarden.nvml.readings import FIELDS, POLL_CALLS, SLOW_CALLS
from gpuwarden.trace import read_trace

_CLOCK_DOMAIN = {getattr(pynvml, v): k for k, v in CLOCK_DOMAINS.items()}
_THRESHOLD_KEY = {getattr(pynvml, v): k for k, v in TEMPERATURE_THRESHOLDS.items()}
_GPM_KEY = {getattr(pynvml, mid): (key, scale) for key, (mid, scale) in GPM_METRICS.items()}

#: The calls of the catalogue's declared readings, by pynvml function name: answered generically (``_answer``).
_PLANNED = (*POLL_CALLS, *SLOW_CALLS)
DECLARED = {c.function: [d for d in _PLANNED if d.function == c.function] for c in _PLANNED}

#: Every pynvml function the fake answers; ``install`` patches exactly these.
FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetMigMode",
    "nvmlGpmQueryDeviceSupport",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
)


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _address(ptr: Any) -> int:
    return int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


def _nvml_number(r: GpuReading, reading: Reading) -> int | None:
    """The recorded value of a declared reading in NVML's own unit (an int, as NVML answers), None if absent."""
    value = getattr(r, reading.field)
    if reading.key is not None:
        value = (value or {}).get(reading.key)
    if value is None:
        return None
    return int(value) if reading.integer else round(value / reading.scale)


def _process_samples(r: GpuReading, struct: Any) -> list[Any]:
    """One ``struct`` (pid, timeStamp, smUtil) per recorded process of ``r`` with ``sm_utilization_ratio``, stamped with
    the record's time; NOT_FOUND when there is none (as NVML when no process ran)."""
    stamp = int(r.timestamp * 1e6)
    out = []
    for p in r.processes or ():
        if p.sm_utilization_ratio is not None:
            s = struct()
            s.pid, s.timeStamp, s.smUtil = p.pid, stamp, round(p.sm_utilization_ratio * 100)
            out.append(s)
    if not out:
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)
    return out


def _link_field(r: GpuReading, fid: int, link: int) -> int | None:
    """A recorded per-link field-value counter (gpuwarden.nvml.nvlink.FIELD_COUNTERS), None if absent."""
    from gpuwarden.nvml.nvlink import FIELD_COUNTERS

    kind = next((k for k, name in FIELD_COUNTERS.items() if getattr(pynvml, name, None) == fid), None)
    return None if kind is None else r.nvlink_link_errors_total.get(f"{link}:{kind}")


class _Device:
    """One fake GPU: its index, static facts and cursor into the trace."""

    def __init__(self, static: GpuStatic, records: list[GpuReading]) -> None:
        self.static = static
        self.records = records
        self.reads = 0  # polls started on this GPU (nvmlDeviceGetUtilizationRates calls)
        self.lost_from: int | None = None
        self.pids: list[int] | None = None  # hold(): live PIDs listed instead of the recorded processes

    @property
    def current(self) -> GpuReading:
        return self.records[max(self.reads - 1, 0) % len(self.records)]


class FakeNvml:
    """A fake of the pynvml functions in ``FUNCTIONS``, answering from the trace at ``path`` (see module doc)."""

    def __init__(self, path: Path) -> None:
        self.header, polls = read_trace(path)
        node = self.header.node
        self.devices = [_Device(s, [next(g for g in p.gpus if g.index == s.index) for p in polls]) for s in node.gpus]
        self.calls: Counter[str] = Counter()
        self.init_error: int | None = None
        self._unloaded: int | None = None
        self._initialized = False
        self._generation = 0
        self._lock = threading.Lock()
        self._hangs: dict[str, threading.Event] = {}
        self._entered: dict[str, threading.Event] = {}
        self._handles: dict[int, tuple[int, int]] = {}  # handle address -> (device index, generation)
        self._keep: list[Any] = []  # ctypes objects whose addresses are handed out
        self._samples: dict[int, tuple[int, int] | None] = {}  # GPM sample address -> (device, reads)
        self._xid: list[tuple[int, int]] = []
        self.legacy_process_utilization = False  # nvmlDeviceGetProcessesUtilizationInfo answers FUNCTION_NOT_FOUND
        self._registered: set[int] = set()

    @property
    def initialized(self) -> bool:
        """True between a successful nvmlInit and nvmlShutdown."""
        return self._initialized

    # -- fault switches -------------------------------------------------------------------------------

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        """Replace every function of ``FUNCTIONS`` in the pynvml module with this fake's; return self."""
        for name in FUNCTIONS:
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        for name in DECLARED:
            monkeypatch.setattr(pynvml, name, functools.partial(self._answer, name))
        return self

    def lose(self, index: int, from_poll: int | None = None) -> None:
        """Make GPU ``index`` answer GPU_IS_LOST from its poll ``from_poll`` (1-based; default its next poll)."""
        dev = self.devices[index]
        dev.lost_from = from_poll if from_poll is not None else dev.reads + 1

    def restore(self, index: int) -> None:
        """Undo ``lose(index)``."""
        self.devices[index].lost_from = None

    def hold(self, index: int, pids: list[int]) -> None:
        """Make GPU ``index`` list ``pids`` (1 GiB each) as its compute processes instead of the recorded ones; its
        memory in use (nvmlDeviceGetMemoryInfo) is the recorded one plus 1 GiB per held PID, as a process's memory
        shows there too."""
        self.devices[index].pids = pids

    def hang(self, name: str) -> None:
        """Make the function ``name`` block until ``release(name)``."""
        with self._lock:
            self._hangs[name] = threading.Event()
            self._entered[name] = threading.Event()

    def entered(self, name: str) -> threading.Event:
        """An Event set once some caller is blocked in the hanging function ``name``."""
        return self._entered[name]

    def release(self, name: str) -> None:
        """Let callers blocked in ``name`` go on, and stop hanging it."""
        with self._lock:
            ev = self._hangs.pop(name, None)
        if ev is not None:
            ev.set()

    def unload(self, code: int = pynvml.NVML_ERROR_UNINITIALIZED) -> None:
        """Simulate the driver going away: every call raises ``code``, nvmlInit raises DRIVER_NOT_LOADED."""
        self._unloaded = code

    def load(self) -> None:
        """The driver is back: nvmlInit works again (and hands out new handles)."""
        self._unloaded = None

    def inject_xid(self, index: int, code: int) -> None:
        """Queue an XID event ``code`` on GPU ``index`` for nvmlEventSetWait_v2."""
        with self._lock:
            self._xid.append((index, code))

    # -- plumbing -------------------------------------------------------------------------------------

    def _enter(self, name: str, handle: Any = None) -> _Device | None:
        with self._lock:
            self.calls[name] += 1
            hang = self._hangs.get(name)
            entered = self._entered.get(name)
        if hang is not None:
            assert entered is not None
            entered.set()
            hang.wait(60)
        if name == "nvmlInit":
            return None
        if self._unloaded is not None and name != "nvmlShutdown":
            raise _err(self._unloaded)
        if not self._initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        index, gen = self._handles.get(_address(handle), (-1, -1))
        if index < 0:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gen != self._generation:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        dev = self.devices[index]
        if name == "nvmlDeviceGetUtilizationRates":
            dev.reads += 1
        if dev.lost_from is not None and dev.reads >= dev.lost_from:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return dev

    def _dev(self, name: str, handle: Any) -> _Device:
        dev = self._enter(name, handle)
        assert dev is not None
        return dev

    @staticmethod
    def _need(value: Any) -> Any:
        if value is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _answer(self, function: str, handle: Any, *args: Any) -> Any:
        """Answer a declared reading's call from the record, in NVML's units and shape: the number, a struct with
        the picked attributes, or a list with the picked items (NOT_SUPPORTED where the record lacks a value)."""
        r = self._dev(function, handle).current
        call = next(c for c in DECLARED[function] if c.args == args)
        values = [(reading, _nvml_number(r, reading)) for reading in call.readings]
        if any(v is None for _, v in values):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        first = call.readings[0].pick
        if first is None:
            return values[0][1]
        if isinstance(first, str):
            return SimpleNamespace(**{str(reading.pick): v for reading, v in values})
        out: list[Any] = [0] * (max(int(reading.pick or 0) for reading, _ in values) + 1)
        for reading, v in values:
            out[int(reading.pick or 0)] = v
        return out

    # -- system ---------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Start the fake library (raises ``init_error`` or, while unloaded, DRIVER_NOT_LOADED)."""
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise _err(self.init_error)
        if self._unloaded is not None:
            raise _err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if not self._initialized:
            self._generation += 1
        self._initialized = True

    def nvmlShutdown(self) -> None:
        """Stop the fake library; handles of this generation stop working."""
        self._enter("nvmlShutdown")
        self._initialized = False

    def nvmlDeviceGetCount(self) -> int:
        """Number of GPUs in the trace."""
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """A fresh ``c_nvmlDevice_t`` pointer for GPU ``index`` of this generation."""
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = ctypes.pointer(pynvml.struct_c_nvmlDevice_t())
        with self._lock:
            self._keep.append(handle)
            self._handles[_address(handle)] = (index, self._generation)
        return handle

    def nvmlSystemGetDriverVersion(self) -> str:
        """The recorded driver version."""
        self._enter("nvmlSystemGetDriverVersion")
        return self._need(self.header.node.driver_version)

    def nvmlSystemGetNVMLVersion(self) -> str:
        """The recorded NVML version."""
        self._enter("nvmlSystemGetNVMLVersion")
        return self._need(self.header.node.nvml_version)

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        """The recorded CUDA driver version as NVML's int (13.0 -> 13000)."""
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        major, minor = self._need(self.header.node.cuda_driver_version).split(".")
        return int(major) * 1000 + int(minor) * 10

    # -- static ---------------------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        """The recorded UUID."""
        return self._dev("nvmlDeviceGetUUID", handle).static.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        """The recorded product name."""
        return self._dev("nvmlDeviceGetName", handle).static.name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        """An ``nvmlPciInfo_t`` with the recorded bus id (upper case, as NVML writes it)."""
        s = self._dev("nvmlDeviceGetPciInfo", handle).static
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._need(s.pci_bus_id).upper().encode()
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        """``c_nvmlMemory_v2_t`` (version nvmlMemory_v2) or ``c_nvmlMemory_t``, in bytes."""
        dev = self._dev("nvmlDeviceGetMemoryInfo", handle)
        r = dev.current
        total = r.memory_total_bytes if r.memory_total_bytes is not None else dev.static.memory_total_bytes
        if dev.pids is not None and r.memory_used_bytes is not None:
            held = 2**30 * len(dev.pids)
            free = None if r.memory_free_bytes is None else max(0, r.memory_free_bytes - held)
            r = r.model_copy(update={"memory_used_bytes": r.memory_used_bytes + held, "memory_free_bytes": free})
        if version == pynvml.nvmlMemory_v2:
            if r.memory_used_bytes is None or r.memory_reserved_bytes is None:
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            mem = pynvml.c_nvmlMemory_v2_t()
            mem.version = version
            mem.total, mem.reserved = self._need(total), r.memory_reserved_bytes
            mem.free, mem.used = self._need(r.memory_free_bytes), r.memory_used_bytes
            return mem
        m1 = pynvml.c_nvmlMemory_t()
        m1.total = self._need(total)
        m1.used = r.memory_used_bytes or 0
        m1.free = r.memory_free_bytes if r.memory_free_bytes is not None else m1.total - m1.used
        return m1

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        """[min, max] power limit in milliwatts."""
        s = self._dev("nvmlDeviceGetPowerManagementLimitConstraints", handle).static
        lo, hi = self._need(s.power_limit_min_watts), self._need(s.power_limit_max_watts)
        return [round(lo * 1000), round(hi * 1000)]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        """Default power limit in milliwatts."""
        s = self._dev("nvmlDeviceGetPowerManagementDefaultLimit", handle).static
        return round(self._need(s.power_limit_default_watts) * 1000)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        """NVML_DEVICE_ARCH_* of the recorded architecture."""
        s = self._dev("nvmlDeviceGetArchitecture", handle).static
        return int(getattr(pynvml, f"NVML_DEVICE_ARCH_{self._need(s.architecture).upper()}"))

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        """(major, minor)."""
        s = self._dev("nvmlDeviceGetCudaComputeCapability", handle).static
        major, minor = self._need(s.compute_capability).split(".")
        return int(major), int(minor)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        """[current, pending] ECC mode."""
        s = self._dev("nvmlDeviceGetEccMode", handle).static
        on = int(self._need(s.ecc_enabled))
        return [on, on]

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        """[current, pending] MIG mode."""
        s = self._dev("nvmlDeviceGetMigMode", handle).static
        on = int(self._need(s.mig_enabled))
        return [on, on]

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        """``c_nvmlGpmSupport_t`` with isSupportedDevice from the trace."""
        s = self._dev("nvmlGpmQueryDeviceSupport", handle).static
        sup = pynvml.c_nvmlGpmSupport_t()
        sup.version = pynvml.NVML_GPM_SUPPORT_VERSION
        sup.isSupportedDevice = int(s.gpm_supported)
        return sup

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        """Maximum clock of a domain in MHz."""
        s = self._dev("nvmlDeviceGetMaxClockInfo", handle).static
        return round(self._need(s.clock_max_hertz.get(_CLOCK_DOMAIN[clock_type])) / 1e6)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        """A temperature threshold in degrees Celsius."""
        s = self._dev("nvmlDeviceGetTemperatureThreshold", handle).static
        return round(self._need(s.temperature_thresholds_celsius.get(_THRESHOLD_KEY.get(threshold, ""))))

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        """The recorded serial number."""
        return self._need(self._dev("nvmlDeviceGetSerial", handle).static.serial)

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        """The recorded VBIOS version."""
        return self._need(self._dev("nvmlDeviceGetVbiosVersion", handle).static.vbios_version)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """The recorded /dev/nvidiaN minor number."""
        return self._need(self._dev("nvmlDeviceGetMinorNumber", handle).static.minor_number)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        """Maximum PCIe generation."""
        return self._need(self._dev("nvmlDeviceGetMaxPcieLinkGeneration", handle).static.pcie_max_generation)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        """Maximum PCIe width."""
        return self._need(self._dev("nvmlDeviceGetMaxPcieLinkWidth", handle).static.pcie_max_width)

    # -- every poll -----------------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        """A ``c_nvmlFieldValue_t`` array: NVLink link count, memory temperature, PCIe replays, event ns."""
        dev = self._dev("nvmlDeviceGetFieldValues", handle)
        r = dev.current
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, asked in enumerate(field_ids):
            fv = values[i]
            fid, scope = asked if isinstance(asked, tuple) else (asked, 0)
            fv.fieldId, fv.scopeId = fid, scope
            fv.timestamp = int(time.time() * 1e6)
            if isinstance(asked, tuple):  # a per-link counter (Blackwell's): from the recording where it has one
                link_count = _link_field(r, fid, scope)
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if link_count is None else pynvml.NVML_SUCCESS
                fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                fv.value.ullVal = link_count or 0
                continue
            number: float | None = None
            if fid == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                number = dev.static.nvlink_link_count
            elif fid in FIELDS:
                number = _nvml_number(r, FIELDS[fid])
            if number is None:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            fv.nvmlReturn = pynvml.NVML_SUCCESS
            if fid in (pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, pynvml.NVML_FI_DEV_MEMORY_TEMP):
                fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                fv.value.uiVal = round(number)
            else:
                fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                fv.value.ullVal = round(number)
        return values

    def nvmlDeviceGetSamples(self, handle: Any, sampling_type: int, last_seen_us: int) -> tuple[int, list[Any]]:
        """(value type, [c_nvmlSample_t]) of the record's samples re-stamped to end now; NOT_FOUND when none."""
        r = self._dev("nvmlDeviceGetSamples", handle).current
        if not r.utilization_samples:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        shift = time.time() - r.utilization_samples[-1][0]
        out = []
        for ts, ratio in r.utilization_samples:
            s = pynvml.c_nvmlSample_t()
            s.timeStamp = int((ts + shift) * 1e6)
            s.sampleValue.uiVal = round(ratio * 100)
            if s.timeStamp > last_seen_us:
                out.append(s)
        if not out:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        """(corrected, uncorrected, pending, failure)."""
        rows = self._dev("nvmlDeviceGetRemappedRows", handle).current.remapped_rows
        if not rows:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return rows["corrected"], rows["uncorrected"], rows["pending"], rows["failure"]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        """The recorded state of ``link`` (1 active, 0 inactive); NOT_SUPPORTED where the recording has none."""
        up = self._dev("nvmlDeviceGetNvLinkState", handle).current.nvlink_link_up
        if str(link) not in up:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_NVLINK_STATE_ACTIVE if up[str(link)] else pynvml.NVML_NVLINK_STATE_INACTIVE

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        """The recorded count of one of ``link``'s data-link error counters; NOT_SUPPORTED where absent."""
        from gpuwarden.nvml.nvlink import ERROR_COUNTERS

        errors = self._dev("nvmlDeviceGetNvLinkErrorCounter", handle).current.nvlink_link_errors_total
        kind = next((k for k, name in ERROR_COUNTERS.items() if getattr(pynvml, name) == counter), None)
        if kind is None or f"{link}:{kind}" not in errors:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return errors[f"{link}:{kind}"]

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        """Fill the (by reference) nvmlGpuFabricInfo_v3 struct from the recorded fabric; NOT_SUPPORTED without."""
        from gpuwarden.nvml.nvlink import FABRIC_CHECKS, FABRIC_STATES, FABRIC_SUMMARIES

        fabric = self._dev("nvmlDeviceGetGpuFabricInfoV", handle).current.fabric
        if fabric is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        target = info._obj
        target.state = {v: k for k, v in FABRIC_STATES.items()}[fabric.state]
        target.status = pynvml.NVML_SUCCESS if fabric.status == "success" else pynvml.NVML_ERROR_UNKNOWN
        target.cliqueId = fabric.clique_id
        raw = bytes.fromhex(fabric.cluster_uuid.replace("-", "")) or bytes(16)
        ctypes.memmove(target.clusterUuid, raw, 16)
        mask = 0
        for name, ok in fabric.health.items():
            mask |= (1 if ok else 2) << getattr(pynvml, FABRIC_CHECKS[name])
        target.healthMask = mask
        target.healthSummary = {v: k for k, v in FABRIC_SUMMARIES.items()}[fabric.health_summary]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """``nvmlFriendlyObject`` per recorded process: pid, usedGpuMemory, instance ids."""
        dev = self._dev("nvmlDeviceGetComputeRunningProcesses", handle)
        r = dev.current
        if dev.pids is not None:
            held = [ProcessReading(pid=pid, gpu_memory_bytes=2**30) for pid in dev.pids]
            r = r.model_copy(update={"processes": held})
        if r.processes is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for p in r.processes:
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid = p.pid
            info.usedGpuMemory = p.gpu_memory_bytes or 0
            obj = pynvml.nvmlStructToFriendlyObject(info)
            if p.gpu_memory_bytes is None:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list[Any]:
        """One sample per recorded process with ``sm_utilization_ratio``, stamped with the record's time; NOT_FOUND
        when the record has none (as NVML when no process ran). ``last_seen_us`` is not compared: the recorded
        times are older than the clock the caller starts from."""
        r = self._dev("nvmlDeviceGetProcessUtilization", handle).current
        return _process_samples(r, pynvml.c_nvmlProcessUtilizationSample_t)

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, last_seen_us: int) -> list[Any]:
        """The same samples as ``nvmlDeviceGetProcessUtilization`` in the newer call's struct
        (c_nvmlProcessUtilizationInfo_v1_t); FUNCTION_NOT_FOUND while ``legacy_process_utilization`` is set (a driver
        before 550, or a binding without the call)."""
        r = self._dev("nvmlDeviceGetProcessesUtilizationInfo", handle).current
        if self.legacy_process_utilization:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return _process_samples(r, pynvml.c_nvmlProcessUtilizationInfo_v1_t)

    # -- MIG (the recorded traces have none: a GPU in MIG mode lists the recorded MIG devices) ------

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        """MIG devices of the record."""
        return len(self._dev("nvmlDeviceGetMaxMigDeviceCount", handle).current.mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        """A handle of MIG device ``index``: (parent index, MIG position) kept by address."""
        dev = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(dev.current.mig):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no recorded MIG trace exists to answer from

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        """Not answerable without a recorded MIG device."""
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        """Not answerable without a recorded MIG device."""
        self._enter("nvmlDeviceGetComputeInstanceId", handle)
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # -- GPM ------------------------------------------------------------------------------------------

    def nvmlGpmSampleAlloc(self) -> Any:
        """A ``c_nvmlGpmSample_t`` pointer (empty until nvmlGpmSampleGet)."""
        self._enter("nvmlGpmSampleAlloc")
        sample = ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        with self._lock:
            self._keep.append(sample)
            self._samples[_address(sample)] = None
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        """Forget a sample."""
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            self._samples.pop(_address(sample), None)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        """Stamp ``sample`` with the GPU and its current poll; return it (as pynvml does)."""
        dev = self._dev("nvmlGpmSampleGet", handle)
        self._samples[_address(sample)] = (dev.static.index, dev.reads)
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        """No recorded MIG GPM: NOT_SUPPORTED."""
        self._enter("nvmlGpmMigSampleGet", handle)
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        """Fill ``req.metrics`` with the recorded GPM averages of sample2's poll (NVML units: % and MiB/s)."""
        self._enter("nvmlGpmMetricsGet")
        stamp = self._samples.get(_address(req.sample2))
        if stamp is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[stamp[0]]
        gpm = dev.records[max(stamp[1] - 1, 0) % len(dev.records)].gpm
        for i in range(req.numMetrics):
            m = req.metrics[i]
            key, scale = _GPM_KEY[m.metricId]
            if key in gpm:
                m.value = gpm[key] / scale
                m.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = pynvml.NVML_ERROR_NO_DATA
        return req

    # -- XID events -----------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        """An event set (an opaque object)."""
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        """Free the event set."""
        self._enter("nvmlEventSetFree")

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        """XID critical errors are supported."""
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        return int(pynvml.nvmlEventTypeXidCriticalError)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        """Register a GPU for XID events."""
        self._enter("nvmlDeviceRegisterEvents", handle)
        self._registered.add(_address(handle))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        """The next injected XID as ``c_nvmlEventData_t``, else TIMEOUT after at most 50 ms."""
        self._enter("nvmlEventSetWait_v2")
        deadline = time.monotonic() + min(timeout_ms, 50) / 1000
        while True:
            with self._lock:
                if self._xid:
                    index, code = self._xid.pop(0)
                    live = [a for a, (i, g) in self._handles.items() if i == index and g == self._generation]
                    handle = next((self._keep_handle(a) for a in live if a in self._registered), None)
                    if handle is not None:
                        data = pynvml.c_nvmlEventData_t()
                        data.device = handle
                        data.eventType = pynvml.nvmlEventTypeXidCriticalError
                        data.eventData = code
                        return data
            if time.monotonic() >= deadline:
                raise _err(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(0.005)

    def _keep_handle(self, address: int) -> Any:
        return next(h for h in self._keep if isinstance(h, pynvml.c_nvmlDevice_t) and _address(h) == address)
