"""XID (critical error) events in their own thread, so a poll never waits on them.

Sources: nvmlEventSetCreate, nvmlDeviceGetSupportedEventTypes, nvmlDeviceRegisterEvents with
nvmlEventTypeXidCriticalError, nvmlEventSetWait_v2 (eventData is the XID code).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any

import pynvml

from gpuwarden.model import XidEvent
from gpuwarden.nvml.calls import Caller

log = logging.getLogger(__name__)

#: Each wait that times out costs CPU (the NVMLError pynvml raises; docs/performance.md): wait 2 s, so
#: the thread wakes twice less often than a 1 s poll; an event ends the wait at once. ``stop()`` waits for it.
_WAIT_MS = 2000


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    """Waits for XID events on every registered GPU and queues them by GPU index.

    ``start()`` registers the devices and starts a daemon thread; ``drain(index)`` returns and
    clears the events of one GPU; ``stop()`` ends the thread and frees the event set.
    ``registered`` lists the indices whose XID events are watched.
    """

    def __init__(self, handles: dict[int, Any], caller: Caller) -> None:
        self._handles = handles
        self._caller = caller
        self._by_address = {_address(h): i for i, h in handles.items()}
        self._pending: dict[int, list[XidEvent]] = {i: [] for i in handles}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self.registered: list[int] = []

    def start(self) -> None:
        """Create the event set, register each GPU that supports XID events, start the thread."""
        self._set = self._caller.call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        if self._set is None:
            return
        for index, handle in self._handles.items():
            types = self._caller.call(
                "nvmlDeviceGetSupportedEventTypes", pynvml.nvmlDeviceGetSupportedEventTypes, handle
            )
            if types is None or not types & pynvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._set)
                self.registered.append(index)
            except pynvml.NVMLError as exc:
                log.warning("XID events unavailable on GPU %d: %s", index, exc)
        if self.registered:
            self._thread = threading.Thread(target=self._run, name="gpuwarden-xid", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, _WAIT_MS)
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) != pynvml.NVML_ERROR_TIMEOUT:
                    self._caller.errors[("nvmlEventSetWait", str(exc))] += 1
                    self._stop.wait(1.0)
                continue
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            index = self._by_address.get(_address(data.device))
            if index is None:
                continue
            with self._lock:
                self._pending[index].append(XidEvent(timestamp=time.time(), xid=int(data.eventData)))

    def drain(self, index: int) -> list[XidEvent]:
        """Return the XID events of GPU ``index`` since the last drain (oldest first)."""
        with self._lock:
            events = self._pending.get(index)
            if not events:
                return []
            self._pending[index] = []
            return events

    def stop(self) -> None:
        """Stop the thread (within one wait, 2 s) and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * _WAIT_MS / 1000)
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except pynvml.NVMLError:
                pass
            self._set = None
