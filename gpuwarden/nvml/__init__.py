"""The NVML layer: the only package of gpuwarden that imports ``pynvml``.

It discovers GPUs, reads static facts once, polls readings at the cadence their cost allows,
watches XID events, and returns plain ``gpuwarden.model`` data.
"""

from gpuwarden.nvml.source import NvmlSource

__all__ = ["NvmlSource"]
