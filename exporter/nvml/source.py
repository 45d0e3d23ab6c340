"""The live source: NVML initialised once, every GPU polled through GpuPoller."""

from __future__ import annotations

import logging
import time
from collections import Counter

import pynvml

from exporter.model import NodeStatic, PollResult
from exporter.nvml.calls import Caller, decode, error_name
from exporter.nvml.device import GpuPoller
from exporter.nvml.events import XidWatcher
from exporter.nvml.static import read_gpu_static, read_node_static
from exporter.procinfo import ProcessInspector, read_host
from exporter.source import SourceError

log = logging.getLogger(__name__)

_START_ERRORS = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "the NVML library (libnvidia-ml.so.1) was not found: is the NVIDIA driver installed?"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open /dev/nvidia* (run as a user that may)",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the kernel driver versions differ (reload the driver)"
    ),
}


class NvmlSource:
    """Reads every GPU of this node through NVML.

    ``open()`` calls nvmlInit, reads static facts and starts the XID watcher; it raises SourceError
    with one line when NVML cannot start. ``poll()`` returns a PollResult of every GPU (a lost GPU has
    ``up=False``). ``close()`` stops the watcher and calls nvmlShutdown.
    """

    kind = "nvml"

    def __init__(
        self,
        *,
        slow_interval: float = 10.0,
        processes: bool = True,
        xid_events: bool = True,
        gpu_indices: list[int] | None = None,
    ) -> None:
        self._slow_interval = slow_interval
        self._processes = processes
        self._xid_events = xid_events
        self._gpu_indices = gpu_indices
        self._errors: Counter[tuple[str, str]] = Counter()
        self._pollers: list[GpuPoller] = []
        self._inspector = ProcessInspector() if processes else None
        self._xid: XidWatcher | None = None
        self._open = False

    def open(self) -> NodeStatic:
        """Initialise NVML and return the node's static facts. Raises SourceError."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            raise SourceError(
                f"NVML unavailable: {_START_ERRORS.get(code, decode(str(exc)))} ({error_name(exc)})"
            ) from exc
        except OSError as exc:  # ctypes could not load the library
            raise SourceError(f"NVML unavailable: {exc}") from exc
        self._open = True
        try:
            count = pynvml.nvmlDeviceGetCount()
            indices = self._gpu_indices if self._gpu_indices is not None else list(range(count))
            missing = [i for i in indices if i >= count]
            if missing:
                raise SourceError(f"GPU index {missing[0]} asked for, but this node has {count} GPUs")
            handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
            statics = []
            for i, h in handles.items():
                statics.append(read_gpu_static(i, h, Caller(self._errors)))
            if self._xid_events:
                self._xid = XidWatcher(handles, Caller(self._errors))
                self._xid.start()
            self._pollers = [
                GpuPoller(s, handles[s.index], Caller(self._errors), self._inspector, self._xid, self._slow_interval)
                for s in statics
            ]
            return read_node_static(Caller(self._errors), statics)
        except pynvml.NVMLError as exc:
            self.close()
            raise SourceError(f"NVML failed while discovering GPUs: {decode(str(exc))} ({error_name(exc)})") from exc

    def poll(self) -> PollResult:
        """Read every GPU and the host once; never raises for one GPU's failure."""
        start = time.perf_counter()
        now = time.time()
        gpus = [p.read(now) for p in self._pollers]
        if self._inspector is not None:
            live = {pr.pid for g in gpus for pr in (g.processes or ())}
            self._inspector.forget_except(live)
        host = read_host()
        return PollResult.model_construct(
            timestamp=now, duration_seconds=time.perf_counter() - start, gpus=gpus, host=host
        )

    def errors(self) -> dict[tuple[str, str], int]:
        """Return NVML failures so far, by (call, error name)."""
        return dict(self._errors)

    def close(self) -> None:
        """Stop the XID thread, free GPM samples and shut NVML down (idempotent)."""
        if self._xid is not None:
            self._xid.stop()
            self._xid = None
        for p in self._pollers:
            p.close()
        self._pollers = []
        if self._open:
            self._open = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", exc)
