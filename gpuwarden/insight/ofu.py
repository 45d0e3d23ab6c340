"""Overall FLOP Utilization (OFU): an estimate of a GPU's model FLOP utilization (MFU) from two counters.

OFU = GPM any-tensor activity x (SM clock / maximum SM clock). GPM's tensor activity is the share of cycles a tensor
pipe issued work, whatever the precision, so at full activity the GPU runs at its dense tensor peak for the
precision in use *at the current clock*; scaling by the clock over its maximum expresses that against the peak at
the maximum clock, which is how MFU's peak is quoted. Pedersen et al., "Instant GPU Efficiency Visibility at Fleet
Scale" (arXiv 2605.20799): within 2 points of application MFU on GEMMs after a tile-quantization correction, r = 0.78
over 608 production jobs. Not reproduced here: the tile-quantization correction (it needs the GEMM shapes, which a
node daemon cannot see: padded tiles keep the pipe busy without model FLOPs, so OFU reads above MFU for shapes that
do not fill their tiles) and anything for FLOPs outside the tensor pipes (FP32/FP64 CUDA-core work reads 0). Checked
against workloads' own FLOP counts on an H100 by tools/ofu_check.py (docs/scores.md has the table).
"""

from __future__ import annotations

from gpuwarden.model import GpuReading, GpuStatic


def flop_utilization(g: GpuReading, static: GpuStatic | None) -> float | None:
    """The OFU of one poll of a GPU, in [0, 1]: ``g.gpm["tensor_activity"]`` (nvmlGpmMetricsGet
    NVML_GPM_METRIC_ANY_TENSOR_UTIL, as a ratio) x ``g.clock_hertz["sm"]`` (nvmlDeviceGetClockInfo SM) /
    ``static.clock_max_hertz["sm"]`` (nvmlDeviceGetMaxClockInfo SM). None where any of them is missing (no GPM:
    before Hopper, or GPM unsupported; a GPU down) or the maximum clock is not positive. Raises nothing."""
    if static is None or not g.up:
        return None
    tensor = g.gpm.get("tensor_activity")
    clock = g.clock_hertz.get("sm")
    top = static.clock_max_hertz.get("sm")
    if tensor is None or clock is None or not top or top <= 0:
        return None
    return max(0.0, min(1.0, tensor * clock / top))
