"""Each NVLink link of a GPU, and the GPU's NVLink fabric: what a link that keeps recovering or a fabric that never
came up looks like before it is an outage.

Measured on two H200 (NVLink 4, 18 links each, driver 580.159.04, tools/nvlink_probe.py): the field values that sum
CRC errors over all links (NVML_FI_DEV_NVLINK_CRC_*_ERROR_COUNT_TOTAL, what ``gpu_nvlink_errors_total`` read) and the
per-link ``_L<n>`` fields answer NOT_SUPPORTED there, while ``nvmlDeviceGetNvLinkErrorCounter`` answers per link for
replay, recovery, CRC flit, CRC data and ECC data errors (each call 0.4-1 ms: 90 calls, 40-100 ms, for 18 links), and
``nvmlDeviceGetNvLinkState`` a few microseconds. Blackwell's counters of link recovery events and of effective and
symbol errors (``NVML_FI_DEV_NVLINK_COUNT_*``, field values read with ``scopeId`` = the link) answer NOT_SUPPORTED on
Hopper; they are asked once and kept where they answer. So:

- every slow read (``slow_interval``): each link's state (nvmlDeviceGetNvLinkState), and the fabric
  (nvmlDeviceGetGpuFabricInfoV, v3: state, registration status, clique, cluster UUID, health mask and summary);
- at the first slow read, then every LINK_COUNTER_SLOW_READS slow reads, each GPU at its own offset so that a node's
  GPUs do not read together after the first: each active link's error counters, one nvmlDeviceGetNvLinkErrorCounter
  call per link and counter, and Blackwell's in one field-value batch per link. A counter type that answers
  NOT_SUPPORTED is asked no more.

Where NVML has no totals, NVLink errors are still watched, per link: the coverage (``gpu_reading_unsupported``) does not
call them missing. The totals are not summed from the links: on the H200s a sustained all-reduce grew the CRC data and
ECC data counters by about 65 a second per GPU with no replay and no recovery (errors the link corrected), which
``GpuNvlinkErrors``, made for NVML's CRC totals, would take for a failing link.

Sources: NVML API reference, "NvLink Methods" and "Field Value Enums"; the fabric's states and health mask from nvml.h
(NVML_GPU_FABRIC_STATE_*, NVML_GPU_FABRIC_HEALTH_MASK_*).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from gpuwarden.model import FabricReading
from gpuwarden.nvml.calls import Caller, error_name, field_value

#: The per-link error counters are read every this many slow reads (about 2 ms a link on Hopper: see the module doc):
#: 300 s at the default slow interval of 30 s. They feed trends over hours (a link that keeps recovering), not pages.
LINK_COUNTER_SLOW_READS = 10
#: The most links a GPU has (NVLink 4 and 5: 18).
MAX_LINKS = 18

#: Per-link counters of nvmlDeviceGetNvLinkErrorCounter: type -> NVML counter (Volta to Hopper).
ERROR_COUNTERS: dict[str, str] = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "ecc_data": "NVML_NVLINK_ERROR_DL_ECC_DATA",
}
#: Per-link counters that are field values read with scopeId = the link: type -> field (Blackwell).
FIELD_COUNTERS: dict[str, str] = {
    "recovery_successful": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS",
    "recovery_failed": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS",
    "effective_errors": "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",
    "symbol_errors": "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS",
}
#: Every per-link counter type (gpu_nvlink_link_errors_total{type}).
LINK_COUNTER_TYPES = (*ERROR_COUNTERS, *FIELD_COUNTERS)

FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
FABRIC_SUMMARIES = {0: "not_supported", 1: "healthy", 2: "unhealthy", 3: "limited_capacity"}
#: Health mask checks of two bits each (0 not supported, 1 true, 2 false): name -> the NVML shift's name. True is a
#: problem for each (degraded bandwidth, a route being recovered, an unhealthy route, an access timeout recovered).
FABRIC_CHECKS = {
    "degraded_bandwidth": "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW",
    "route_recovery": "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY",
    "route_unhealthy": "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY",
    "access_timeout_recovery": "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY",
}


def fabric_reading(state: int, status: int, clique: int, cluster: bytes, mask: int, summary: int) -> FabricReading:
    """A FabricReading from nvmlGpuFabricInfo_v3's fields: the state's and summary's names, the registration
    status as NVML's error name ("success"), the health mask decoded (check -> True when it reports a problem, False
    when fine; unsupported checks left out). Raises nothing."""
    checks = {}
    for name, shift_name in FABRIC_CHECKS.items():
        shift = getattr(pynvml, shift_name, None)
        if shift is None:
            continue
        bits = (mask >> shift) & 0b11
        if bits in (1, 2):
            checks[name] = bits == 1
    return FabricReading(
        state=FABRIC_STATES.get(state, f"unknown_{state}"),
        status="success" if status == pynvml.NVML_SUCCESS else error_name(pynvml.NVMLError(status)),
        clique_id=clique,
        cluster_uuid=_uuid(cluster),
        health=checks,
        health_summary=FABRIC_SUMMARIES.get(summary, f"unknown_{summary}"),
    )


def _uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}" if len(h) == 32 else h


class LinkReader:
    """Reads one GPU's links and fabric (see the module doc) through ``caller``; ``links``: the GPU's NVLink link
    count (NVML_FI_DEV_NVLINK_LINK_COUNT); ``interval``: seconds between counter reads; ``offset``: seconds after
    the first read at which the first counter read comes (a node's GPUs spread over the interval)."""

    def __init__(self, handle: Any, caller: Caller, links: int, interval: float, offset: float = 0.0) -> None:
        self._handle, self._caller = handle, caller
        self._links = min(links, MAX_LINKS)
        self._interval, self._offset = interval, offset
        self._next_counters: float | None = None
        self._counters_read = False
        self.up: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.fabric: FabricReading | None = None
        self._fields = [getattr(pynvml, f) for f in FIELD_COUNTERS.values() if hasattr(pynvml, f)]
        self._field_types = {getattr(pynvml, f): t for t, f in FIELD_COUNTERS.items() if hasattr(pynvml, f)}

    def read_slow(self, now: float) -> None:
        """The slow read: link states and the fabric; the counters too when their interval has passed."""
        c, h = self._caller.call, self._handle
        up = {}
        for link in range(self._links):
            state = c("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, h, link)
            if state is not None:
                up[str(link)] = 0 if int(state) == pynvml.NVML_NVLINK_STATE_INACTIVE else 1
        self.up = up
        self.fabric = self._read_fabric()
        if self._next_counters is None or now >= self._next_counters:
            first = self._next_counters is None
            self._read_counters()
            # read at once the first time (the GPU's counters, and its CRC totals, known from the start), then each
            # GPU at its own offset into the interval
            self._next_counters = now + (self._offset or self._interval if first else self._interval)

    def _read_fabric(self) -> FabricReading | None:
        info = pynvml.c_nvmlGpuFabricInfo_v3_t()
        info.version = pynvml.nvmlGpuFabricInfo_v3
        # pynvml's wrapper passes the struct on as given: by value it crashes the process (seen on an H200)
        if self._caller.call("nvmlDeviceGetGpuFabricInfoV", pynvml.nvmlDeviceGetGpuFabricInfoV, self._handle,
                             ctypes.byref(info)) is None:  # fmt: skip
            return None
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            return None
        return fabric_reading(int(info.state), int(info.status), int(info.cliqueId), bytes(info.clusterUuid),
                              int(info.healthMask), int(info.healthSummary))  # fmt: skip

    def _read_counters(self) -> None:
        c, h = self._caller.call, self._handle
        errors: dict[str, int] = {}
        active = [int(link) for link, on in self.up.items() if on]
        for kind, counter in ERROR_COUNTERS.items():
            name = f"nvmlDeviceGetNvLinkErrorCounter({kind})"
            for link in active:
                value = c(name, pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, getattr(pynvml, counter))
                if value is None:
                    break  # unsupported (asked no more) or failing: the other links alike
                errors[f"{link}:{kind}"] = int(value)
        if self._fields and "nvmlDeviceGetFieldValues(nvlink links)" not in self._caller.unsupported:
            supported = set(self._fields)
            for link in active:
                values = c("nvmlDeviceGetFieldValues(nvlink links)", pynvml.nvmlDeviceGetFieldValues, h,
                           [(f, link) for f in self._fields])  # fmt: skip
                if values is None:
                    break
                for fv in values:
                    value = field_value(fv) if fv.nvmlReturn == pynvml.NVML_SUCCESS else None
                    if value is None:
                        supported.discard(fv.fieldId)
                        continue
                    errors[f"{link}:{self._field_types[fv.fieldId]}"] = int(value)
            self._fields = [f for f in self._fields if f in supported]
        self._counters_read = True
        if errors or not self.errors:
            self.errors = errors

    def unsupported(self) -> list[str]:
        """The link readings this GPU never answers: ``nvlink_link_errors_total`` when no counter type answers (every
        one was asked once), ``nvlink_link_up`` when no state does, ``fabric`` when nvmlDeviceGetGpuFabricInfoV does
        not."""
        gone = self._caller.unsupported
        out = []
        if self._counters_read and not self.errors:
            out.append("nvlink_link_errors_total")
        if "nvmlDeviceGetNvLinkState" in gone:
            out.append("nvlink_link_up")
        if "nvmlDeviceGetGpuFabricInfoV" in gone:
            out.append("fabric")
        return out
