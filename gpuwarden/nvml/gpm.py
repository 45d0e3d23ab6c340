"""GPU Performance Monitoring (GPM, Hopper and newer): SM activity, occupancy, tensor, DRAM, PCIe.

A GPM metric is computed from two samples taken some time apart; ``GpmSampler.read`` takes one
sample per poll and returns the metrics averaged over the interval since the previous poll.
Sources: nvmlGpmSampleAlloc, nvmlGpmSampleGet / nvmlGpmMigSampleGet, nvmlGpmMetricsGet.
"""

from __future__ import annotations

import math
from typing import Any

import pynvml

from gpuwarden.catalog import GPM_METRICS
from gpuwarden.nvml.calls import Caller

#: gpuwarden key -> (NVML GPM metric id, scale to base units), from the catalogue's GPM_METRICS
GPM_IDS: dict[str, tuple[int, float]] = {
    key: (getattr(pynvml, mid), scale) for key, (mid, scale) in GPM_METRICS.items()
}


class GpmSampler:
    """Keeps two GPM samples of one GPU (or one MIG GPU instance) and turns them into metrics.

    The nvmlGpmMetricsGet_t request is built once and reused: building it costs more than the call.
    Metrics whose per-metric return code is not success are left out of the result (and dropped
    from later requests once they answer NOT_SUPPORTED); so is a value that is NaN or infinite, counted
    in the shared error counts as ("nvmlGpmMetricsGet(<key>)", "not_finite").
    """

    def __init__(self, handle: Any, caller: Caller, gpu_instance_id: int | None = None) -> None:
        self._handle = handle
        self._caller = caller
        self._gi = gpu_instance_id
        self._samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        self._current = 0
        self._have_previous = False
        self._build(list(GPM_IDS))

    def _build(self, keys: list[str]) -> None:
        self._keys = keys
        req = pynvml.c_nvmlGpmMetricsGet_t()
        req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(keys)
        for i, key in enumerate(keys):
            req.metrics[i].metricId = GPM_IDS[key][0]
        self._request = req

    def read(self) -> dict[str, float]:
        """Take a sample and return {key: value in base units} over the interval since the last one.

        Returns {} on the first call (one sample is not enough) and when the sample fails.
        """
        sample = self._samples[self._current]
        if self._gi is None:
            ok = self._caller.call("nvmlGpmSampleGet", pynvml.nvmlGpmSampleGet, self._handle, sample)
        else:
            ok = self._caller.call("nvmlGpmMigSampleGet", pynvml.nvmlGpmMigSampleGet, self._handle, self._gi, sample)
        if ok is None:
            self._have_previous = False
            return {}
        previous = self._samples[1 - self._current]
        self._current = 1 - self._current
        if not self._have_previous:
            self._have_previous = True
            return {}
        req = self._request
        req.sample1 = previous
        req.sample2 = sample
        if self._caller.call("nvmlGpmMetricsGet", pynvml.nvmlGpmMetricsGet, req) is None:
            return {}
        out: dict[str, float] = {}
        dropped = []
        for i, key in enumerate(self._keys):
            metric = req.metrics[i]
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                value = float(metric.value)
                if math.isfinite(value):
                    out[key] = value * GPM_IDS[key][1]
                else:
                    self._caller.errors[(f"nvmlGpmMetricsGet({key})", "not_finite")] += 1
            elif metric.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED:
                dropped.append(key)
        if dropped:
            self._build([k for k in self._keys if k not in dropped])
        return out

    def close(self) -> None:
        """Free both samples (nvmlGpmSampleFree)."""
        for s in self._samples:
            try:
                pynvml.nvmlGpmSampleFree(s)
            except pynvml.NVMLError:
                pass
        self._samples = []
