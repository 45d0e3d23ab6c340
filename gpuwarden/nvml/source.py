"""The live source: NVML initialised, every GPU polled through GpuPoller, re-initialised when the driver goes.

Faults handled here (docs/reliability.md):

* a GPU lost mid-run (NVML_ERROR_GPU_IS_LOST) is reported ``up=False`` while the others keep reporting;
* when every GPU fails at once with UNINITIALIZED / DRIVER_NOT_LOADED / LIB_RM_VERSION_MISMATCH / UNKNOWN
  (or every GPU is lost) - a driver reload or a crash - the source closes NVML (nvmlShutdown) and re-opens
  it (nvmlInit, rediscovery by UUID) with exponential backoff (1 s doubling to 5 s), reporting every GPU
  ``up=False`` meanwhile and counting each failed nvmlInit in ``gpuwarden_nvml_errors_total``;
* NVML missing at start: one line (SourceError), or, with ``wait=True``, no GPU and ``up`` False while
  nvmlInit is retried on the same backoff until the driver appears.

Each change of state is logged once, never once per poll.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter
from collections.abc import Callable

import pynvml

from gpuwarden.model import GpuReading, GpuStatic, NodeStatic, PollResult
from gpuwarden.nvml.calls import Caller, decode, error_name
from gpuwarden.nvml.device import CADENCE_SLACK, GPM_INTERVAL, SLOW_INTERVAL, GpuPoller
from gpuwarden.nvml.events import XidWatcher
from gpuwarden.nvml.static import read_gpu_static, read_node_static
from gpuwarden.procinfo import ProcessInspector, read_host
from gpuwarden.server_requests import RequestReader
from gpuwarden.source import SourceError

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


#: Error codes that mean "the library or the driver is gone", not "this GPU is broken".
_DRIVER_GONE = {
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    pynvml.NVML_ERROR_UNKNOWN,
}
_DRIVER_GONE_NAMES = frozenset(error_name(pynvml.NVMLError(code)) for code in _DRIVER_GONE)

#: Backoff between attempts to re-open NVML: first wait, and the longest.
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 5.0


def _describe(exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if isinstance(exc, pynvml.NVMLError):
        return f"{_START_ERRORS.get(code, decode(str(exc)))} ({error_name(exc)})"
    return str(exc)


def _empty(g: GpuReading) -> bool:
    """True when none of the every-poll readings of ``g`` came back."""
    return (
        g.utilization_gpu_ratio is None
        and g.memory_used_bytes is None
        and g.temperature_gpu_celsius is None
        and g.power_usage_watts is None
    )


#: The host's CPU times are read at most once per this many seconds (the kernel builds all of /proc/stat for each
#: read; its cost: docs/performance.md). They only feed the insight
#: analyzer's host-CPU evidence, a mean over a 60 s or longer window.
HOST_MIN_GAP = 5.0


class NvmlSource:
    """Reads every GPU of this node through NVML, and re-opens NVML when the driver goes away.

    ``open()`` calls nvmlInit, reads static facts and starts the XID watcher; it raises SourceError
    with one line when NVML cannot start (unless ``wait``: then it returns a node without GPUs and keeps
    trying in ``poll()``). ``poll()`` returns a PollResult of every GPU (a lost GPU has ``up=False``; while
    NVML is down, every GPU has ``up=False`` and ``error`` says why). ``up`` is False while NVML is down;
    ``static`` is the node's static facts, which change once when a waited-for driver appears.
    ``close()`` stops the watcher and calls nvmlShutdown. ``slow_interval`` and ``gpm_interval`` set each
    GPU's read cadence (gpuwarden.nvml.device.GpuPoller). The host's CPU times
    (psutil.cpu_times, /proc/stat) are read at most once per ``host_min_gap`` seconds (default HOST_MIN_GAP):
    ``PollResult.host`` is None in between (the insight analyzer carries the host's busy ratio over the gap).
    ``server_requests``: ask each GPU job's server for its requests (gpuwarden.server_requests, in a thread of its own).
    ``annotate`` adds what NVML does not know to each poll's GPU readings (the kubelet's pods of each GPU).
    """

    kind = "nvml"

    def __init__(
        self,
        *,
        slow_interval: float = SLOW_INTERVAL,
        gpm_interval: float = GPM_INTERVAL,
        host_min_gap: float = HOST_MIN_GAP,
        processes: bool = True,
        server_requests: bool = False,
        xid_events: bool = True,
        gpu_indices: list[int] | None = None,
        wait: bool = False,
        annotate: Callable[[list[GpuReading]], list[GpuReading]] | None = None,
    ) -> None:
        self._slow_interval = slow_interval
        self._gpm_interval = gpm_interval
        self._host_min_gap = host_min_gap
        self._host_at = -float("inf")
        self._processes = processes
        self._xid_events = xid_events
        self._gpu_indices = gpu_indices
        self._wait = wait
        self._annotate = annotate
        self._errors: Counter[tuple[str, str]] = Counter()
        self._pollers: list[GpuPoller] = []
        # a GPU process's tree of workers is walked again at the host cadence (per poll only its members are read)
        requests = RequestReader() if processes and server_requests else None
        self._inspector = ProcessInspector(tree_refresh=host_min_gap, requests=requests) if processes else None
        self._xid: XidWatcher | None = None
        self._open = False
        self.static: NodeStatic | None = None
        self._down: str | None = None  # why NVML is down (error name), None while it works
        self._down_words: str | None = None  # the same, as the operator reads it
        self._backoff = RETRY_FIRST_SECONDS
        self._retry_at = 0.0

    @property
    def up(self) -> bool:
        """False while NVML is down (waiting for the driver at start, or re-initialising after a reload)."""
        return self._down is None

    @property
    def down_reason(self) -> str | None:
        """Why NVML is down, in words (the start error nvmlInit gave, or every GPU failing); None while it works."""
        if self._down is None:
            return None
        return self._down_words or f"every GPU failed ({self._down}): the driver was reloaded or lost"

    def open(self) -> NodeStatic:
        """Initialise NVML and return the node's static facts. Raises SourceError.

        With ``wait``, an NVML that cannot start is logged in one line and a node without GPUs returned;
        ``poll()`` then retries nvmlInit until it works.
        """
        try:
            self._init()
        except SourceError as exc:
            if not self._wait:
                raise
            log.warning("%s; serving gpuwarden_source_up 0 and retrying every few seconds", exc)
            self._down = "nvml_unavailable"
            self._down_words = str(exc)
            self._retry_at = time.monotonic() + self._backoff
            self.static = NodeStatic(hostname=socket.gethostname())
            return self.static
        self.static = self._discover()
        return self.static

    def _init(self) -> None:
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as exc:  # OSError: ctypes could not load the library
            if isinstance(exc, pynvml.NVMLError):
                self._errors[("nvmlInit", error_name(exc))] += 1
            raise SourceError(f"NVML unavailable: {_describe(exc)}") from exc
        self._open = True

    def _discover(self) -> NodeStatic:
        """Find the GPUs (all, or ``gpu_indices``), read their static facts, start the XID watcher and pollers."""
        try:
            count = pynvml.nvmlDeviceGetCount()
            indices = self._gpu_indices if self._gpu_indices is not None else list(range(count))
            missing = [i for i in indices if i >= count]
            if missing:
                raise SourceError(f"GPU index {missing[0]} asked for, but this node has {count} GPUs")
            handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
            statics = [read_gpu_static(i, h, Caller(self._errors)) for i, h in handles.items()]
            self._start_pollers(handles, statics)
            return read_node_static(Caller(self._errors), statics)
        except pynvml.NVMLError as exc:
            self.close()
            raise SourceError(f"NVML failed while discovering GPUs: {decode(str(exc))} ({error_name(exc)})") from exc
        except SourceError:
            self.close()
            raise

    def _start_pollers(self, handles: dict[int, object], statics: list[GpuStatic]) -> None:
        if self._xid_events:
            self._xid = XidWatcher(handles, Caller(self._errors))
            self._xid.start()
        self._pollers = [
            GpuPoller(
                s,
                handles[s.index],
                Caller(self._errors),
                self._inspector,
                self._xid,
                self._slow_interval,
                gpm_interval=self._gpm_interval,
            )
            for s in statics
        ]

    def _rediscover(self) -> int:
        """After a re-init: find the known GPUs again by UUID; return how many were found."""
        assert self.static is not None
        by_uuid: dict[str, object] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                by_uuid[decode(pynvml.nvmlDeviceGetUUID(h))] = h
            except pynvml.NVMLError:
                continue  # a GPU still lost: it stays down
        handles = {s.index: by_uuid[s.uuid] for s in self.static.gpus if s.uuid in by_uuid}
        self._start_pollers(handles, [s for s in self.static.gpus if s.index in handles])
        return len(handles)

    def poll(self) -> PollResult:
        """Read every GPU and the host once; never raises for one GPU's failure, nor for NVML being down."""
        start = time.perf_counter()
        now = time.time()
        if self._down is not None:
            if time.monotonic() >= self._retry_at:
                self._reopen()
            if self._down is not None:
                return self._result(now, start, self._down_readings(now))
        if self._inspector is not None:
            self._inspector.new_poll()
        gpus, reasons = self._read_gpus(now)
        if self._pollers and sum(reasons.values()) == len(self._pollers):
            self._go_down(reasons.most_common(1)[0][0])
            return self._result(now, start, self._down_readings(now))
        self._backoff = RETRY_FIRST_SECONDS
        if self._inspector is not None:
            live = {pr.pid for g in gpus for pr in (g.processes or ())}
            self._inspector.forget_except(live)
        gpus.sort(key=lambda g: g.index)
        if self._annotate is not None:
            gpus = self._annotate(gpus)
        return self._result(now, start, gpus)

    def _read_gpus(self, now: float) -> tuple[list[GpuReading], Counter[str]]:
        """Every GPU's reading this poll (a GPU of the static facts with no poller reads ``not_found``), and why
        each GPU that is gone is gone: the error of a GPU read down, or of a reading left empty by an error that
        says the GPU or the driver is gone (gpuwarden.nvml.calls)."""
        gpus: list[GpuReading] = []
        reasons: Counter[str] = Counter()
        for p in self._pollers:
            before = self._gone_errors()
            g = p.read(now)
            if not g.up:
                reasons[g.error or "gpu_is_lost"] += 1
            elif _empty(g):
                grown = [key[1] for key, n in self._gone_errors().items() if n > before.get(key, 0)]
                if grown:
                    reasons[grown[0]] += 1
            gpus.append(g)
        known = {g.index for g in gpus}
        assert self.static is not None
        gpus += [self._down_reading(s, now, "not_found") for s in self.static.gpus if s.index not in known]
        return gpus, reasons

    def _result(self, now: float, start: float, gpus: list[GpuReading]) -> PollResult:
        host = None
        if now - self._host_at >= self._host_min_gap - CADENCE_SLACK:
            host, self._host_at = read_host(), now
        return PollResult(timestamp=now, duration_seconds=time.perf_counter() - start, gpus=gpus, host=host)

    def _gone_errors(self) -> dict[tuple[str, str], int]:
        """The error counts whose error means "driver gone" (usually none: an empty dict)."""
        return {k: n for k, n in self._errors.items() if k[1] in _DRIVER_GONE_NAMES}

    def _down_reading(self, s: GpuStatic, now: float, error: str) -> GpuReading:
        return GpuReading(index=s.index, uuid=s.uuid, timestamp=now, up=False, error=error)

    def _down_readings(self, now: float) -> list[GpuReading]:
        assert self.static is not None and self._down is not None
        return [self._down_reading(s, now, self._down) for s in self.static.gpus]

    def _go_down(self, reason: str) -> None:
        log.error(
            "NVML: every GPU failed (%s): the driver was reloaded or lost; re-initialising NVML, GPUs reported down",
            reason,
        )
        self._down = reason
        self._down_words = None
        self._stop_pollers()
        self._shutdown()
        self._retry_at = time.monotonic() + self._backoff

    def _reopen(self) -> None:
        """One attempt to bring NVML back: nvmlInit and (re)discovery; on failure, back off."""
        try:
            self._init()
            if self.static is not None and self.static.gpus:
                found = self._rediscover()
                if not found:
                    raise SourceError("no known GPU answers yet")
                what = f"{found} of {len(self.static.gpus)} GPU(s) back"
            else:
                self.static = self._discover()
                what = f"{len(self.static.gpus)} GPU(s) found"
        except (SourceError, pynvml.NVMLError) as exc:
            self._stop_pollers()
            self._shutdown()
            self._retry_at = time.monotonic() + self._backoff
            log.debug("NVML still unavailable (next try in %.0f s): %s", self._backoff, exc)
            self._backoff = min(self._backoff * 2, RETRY_MAX_SECONDS)
            return
        log.warning("NVML initialised again after %s: %s", self._down, what)
        self._down = self._down_words = None

    def errors(self) -> dict[tuple[str, str], int]:
        """Return NVML failures so far, by (call, error name)."""
        return dict(self._errors)

    def _stop_pollers(self) -> None:
        if self._xid is not None:
            self._xid.stop()
            self._xid = None
        for p in self._pollers:
            p.close()
        self._pollers = []

    def _shutdown(self) -> None:
        if self._open:
            self._open = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)

    def close(self) -> None:
        """Stop the XID thread and the server requests' reader, free GPM samples and shut NVML down (idempotent)."""
        self._stop_pollers()
        if self._inspector is not None and self._inspector.requests is not None:
            self._inspector.requests.close()
        self._shutdown()
