"""The NVIDIA driver's version, asked once (``gpuwarden --version``), without opening the GPUs."""

from __future__ import annotations


def driver_version() -> str | None:
    """The driver's version (nvmlSystemGetDriverVersion, e.g. ``580.159.04``), or None where no driver or NVML
    library answers. Never raises: ``--version`` must print on any machine."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            raw = pynvml.nvmlSystemGetDriverVersion()
            return raw.decode() if isinstance(raw, bytes) else str(raw)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library, a broken one: the version is unknown
        return None
