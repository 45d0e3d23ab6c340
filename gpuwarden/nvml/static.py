"""Facts read once per node and per GPU: identity, versions, limits, maxima, thresholds, modes."""

from __future__ import annotations

import socket
from typing import Any

import pynvml

from gpuwarden.catalog import CLOCK_DOMAINS, TEMPERATURE_THRESHOLDS
from gpuwarden.model import GpuStatic, NodeStatic
from gpuwarden.nvml.calls import Caller, decode

_ARCHITECTURES = {
    getattr(pynvml, name): name.removeprefix("NVML_DEVICE_ARCH_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_DEVICE_ARCH_") and name != "NVML_DEVICE_ARCH_UNKNOWN"
}

#: clock domain -> NVML clock type; threshold name -> NVML threshold type (keys declared in the catalogue)
CLOCK_TYPES = {domain: getattr(pynvml, name) for domain, name in CLOCK_DOMAINS.items()}
_THRESHOLDS = {key: getattr(pynvml, name) for key, name in TEMPERATURE_THRESHOLDS.items()}


def binding_version() -> str | None:
    """Return the installed nvidia-ml-py version (importlib.metadata), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return None


def read_node_static(caller: Caller, gpus: list[GpuStatic]) -> NodeStatic:
    """Return the node's facts: hostname, driver, NVML and CUDA driver versions, and ``gpus``.

    Sources: nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion_v2
    (an int such as 13000, rendered "13.0").
    """
    driver = caller.call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
    nvml = caller.call("nvmlSystemGetNVMLVersion", pynvml.nvmlSystemGetNVMLVersion)
    cuda = caller.call("nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2)
    return NodeStatic(
        hostname=socket.gethostname(),
        driver_version=decode(driver) if driver is not None else None,
        nvml_version=decode(nvml) if nvml is not None else None,
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        binding_version=binding_version(),
        gpus=gpus,
    )


def read_gpu_static(index: int, handle: Any, caller: Caller) -> GpuStatic:
    """Return one GPU's static facts; a fact the GPU does not report is None (or left out of a dict).

    Power limits come in milliwatts and clocks in MHz from NVML and are returned in watts and hertz.
    """
    c = caller.call
    pci = c("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle)
    mem = c("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
    constraints = c(
        "nvmlDeviceGetPowerManagementLimitConstraints", pynvml.nvmlDeviceGetPowerManagementLimitConstraints, handle
    )
    default_limit = c(
        "nvmlDeviceGetPowerManagementDefaultLimit", pynvml.nvmlDeviceGetPowerManagementDefaultLimit, handle
    )
    arch = c("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, handle)
    cc = c("nvmlDeviceGetCudaComputeCapability", pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    ecc = c("nvmlDeviceGetEccMode", pynvml.nvmlDeviceGetEccMode, handle)
    mig = c("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle)
    gpm = c("nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport, handle)
    clock_max: dict[str, float] = {}
    for domain, ctype in CLOCK_TYPES.items():
        mhz = c(f"nvmlDeviceGetMaxClockInfo({domain})", pynvml.nvmlDeviceGetMaxClockInfo, handle, ctype)
        if mhz:
            clock_max[domain] = float(mhz) * 1e6
    thresholds: dict[str, float] = {}
    for key, ttype in _THRESHOLDS.items():
        value = c(f"nvmlDeviceGetTemperatureThreshold({key})", pynvml.nvmlDeviceGetTemperatureThreshold, handle, ttype)
        if value:
            thresholds[key] = float(value)
    serial = c("nvmlDeviceGetSerial", pynvml.nvmlDeviceGetSerial, handle)
    vbios = c("nvmlDeviceGetVbiosVersion", pynvml.nvmlDeviceGetVbiosVersion, handle)
    minor = c("nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, handle)
    max_gen = c("nvmlDeviceGetMaxPcieLinkGeneration", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    links = None
    fv = c(
        "nvmlDeviceGetFieldValues(nvlink_link_count)",
        pynvml.nvmlDeviceGetFieldValues,
        handle,
        [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT],
    )
    if fv is not None and fv[0].nvmlReturn == pynvml.NVML_SUCCESS and fv[0].value.uiVal > 0:
        links = int(fv[0].value.uiVal)
    max_width = c("nvmlDeviceGetMaxPcieLinkWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
    return GpuStatic(
        index=index,
        uuid=decode(pynvml.nvmlDeviceGetUUID(handle)),
        name=decode(pynvml.nvmlDeviceGetName(handle)),
        pci_bus_id=decode(pci.busId).lower() if pci is not None else None,
        serial=decode(serial) if serial else None,
        vbios_version=decode(vbios) if vbios else None,
        architecture=_ARCHITECTURES.get(arch) if arch is not None else None,
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        minor_number=minor,
        memory_total_bytes=int(mem.total) if mem is not None else None,
        power_limit_default_watts=default_limit / 1000.0 if default_limit else None,
        power_limit_min_watts=constraints[0] / 1000.0 if constraints else None,
        power_limit_max_watts=constraints[1] / 1000.0 if constraints else None,
        clock_max_hertz=clock_max,
        temperature_thresholds_celsius=thresholds,
        pcie_max_generation=max_gen,
        pcie_max_width=max_width,
        ecc_enabled=bool(ecc[0]) if ecc else None,
        mig_enabled=bool(mig[0]) if mig else None,
        gpm_supported=bool(gpm.isSupportedDevice) if gpm is not None else False,
        nvlink_link_count=links,
    )
