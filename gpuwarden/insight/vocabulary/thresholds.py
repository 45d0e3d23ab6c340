"""The thresholds of the diagnosis: what each verdict rule compares a window's numbers with, and why that number.

Each constant says where it comes from (an NVML or DCGM definition, a paper, or a calibration on H100 recordings
named beside it). The rules that read them are in gpuwarden.insight.rules; the launch test's own thresholds are in
gpuwarden.insight.launches and the per-poll states' in gpuwarden.insight.vocabulary.states.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from gpuwarden.catalog import clock_event_reasons

#: The alert rules' shipped parameters (gpuwarden/mixin/params.yml): a line the diagnosis and the alerts share is
#: declared there, once, and read here (a site's own ``gpuwarden mixin --params`` moves its alerts, not this); so do
#: the health rules' conditions in ``gpuwarden check`` (gpuwarden.health.conditions.shipped).
ALERT_PARAMS: dict[str, Any] = yaml.safe_load((resources.files("gpuwarden") / "mixin" / "params.yml").read_text())

#: util.gpu at or above this is "utilized" (a kernel ran at least half the time).
BUSY_UTIL = 0.5
#: Launch bound: LAUNCH_UTIL_MIN, LAUNCH_SM_PER_UTIL, LAUNCH_CPU_CORES, LAUNCH_MID_SM_PER_UTIL and the rest of the test
#: are in gpuwarden.insight.launches (the accounting's ``launch`` cause uses the same test per poll interval).
#: Share of the window the job itself paused (GPU and job CPU idle right after GPU work) that makes the verdict.
PAUSED_MIN = 0.25
#: DRAM activity (GPM DRAM bandwidth utilization: achieved over peak HBM bandwidth) at or above this: memory bound.
#: On the roofline a kernel whose bytes per flop put it left of the ridge point runs at the bandwidth roof: it
#: sustains most of the peak bandwidth while its arithmetic pipes wait. GEMMs stay far below (compute bound).
MEMORY_BOUND_DRAM = 0.6
#: Tensor cores idle while the FP32 pipe does the work: tensor activity below this ...
TENSOR_IDLE_MAX = 0.05
#: ... and FP32 pipe activity at or above this (FP32 matrix math that TF32 or bf16 would put on tensor cores).
FP32_BUSY_MIN = 0.3
#: Hot: the GPU within this many degrees Celsius of its own slowdown threshold (or HBM of its memory_max); the
#: overheating alerts' ``hot_margin_celsius``.
HOT_MARGIN_CELSIUS = float(ALERT_PARAMS["hot_margin_celsius"])
#: SM activity per util.gpu below this marks a kernel that occupies the GPU without working (spin).
SPIN_SM_PER_UTIL = 0.5
#: A peer GPU of the same job at or below this fraction of this GPU's util.gpu is a straggler.
PEER_LAG = 0.5
#: PCIe receive rate that marks a copy-bound GPU. H100 traces: h2d_pageable_copy 7.7-9.6 GB/s,
#: starved_cpu_heavy 0.04-0.15 GB/s, compute_bound 0.017 GB/s (our calibration: 1 GiB/s between them).
H2D_RX_BYTES_PER_SECOND = float(2**30)
#: ... while SM activity stays below this (h2d_pageable_copy: 0.000).
H2D_SM_MAX = 0.10
#: ... or, whatever the SMs do between copies, the GPU idles a STARVED_MIN share of the window or more and the job
#: receives at least this many bytes per second of its idle time (PCIe RX / the idle share): copies fill most of it.
#: A blocking copy moves at the link's rate for its kind (pageable: the driver stages it through a pinned buffer),
#: while the GPU idles. H100 recordings (copy_compute, tools/workloads.py): pageable copies of 256 MiB-1 GiB between
#: 0.03-0.3 s of products 7.0-8.0 GB/s an idle second (their own clock: 34-59% of the time copying), pinned 2 GiB
#: 45 GB/s; input prepared by the job or its loader (starved_dataloader, loader_workers, launch-bound kinds)
#: 0.03-0.47; a CPU-stepped optimizer 2.5 (as much back: host_compute_bound). Our calibration: 2 GiB/s, 3.5x below
#: the pageable copies and 4x above the loaders; copies at a pageable rate of 5-10 GB/s then fill a quarter to half of
#: the idle time or more.
H2D_IDLE_RX_BYTES_PER_SECOND = float(2 * 2**30)
#: Device-to-host copies: GPM PCIe TX at least this (a result copied out each step, as H2D_RX_BYTES_PER_SECOND in)...
D2H_TX_BYTES_PER_SECOND = float(2**30)
#: ... this many times what comes in at least (one way out; a CPU-stepped optimizer sends and receives alike: 2.4-2.6
#: GB/s out, 2.3-2.4 in, host_compute_bound)...
D2H_TX_PER_RX = 4.0
#: ... at least this much out per second the SMs are not active (TX / (1 - SM activity)): copies fill the time the
#: GPU does not compute. NVML's util.gpu counts a fast copy as busy (a pageable copy of 1 GiB after each 80 ms step on
#: an H200: util.gpu 0.86 with SMs 0.46 active) and a slow one, staged by a CPU core, as idle, so SM activity, not
#: util.gpu, measures the time not computing. Recordings: device-to-host copies 13.9 (pageable) and 46 (pinned) GB/s
#: a second not computing [H200]; results copied out for metrics on the host 0.11-0.19, checkpoints 0.39-0.46 [H100].
#: Our calibration: 4 GiB/s, 3.5x below the pageable copies: the copies run at the copy engine's rate. Below it a copy
#: staged through a pinned buffer by a CPU core (fresh pageable memory: 1.3 GB/s with the GPU idle 90%, 1.4 a second
#: not computing) and host work on a large output (1.2 GB/s out, idle half the time: 2.4) look alike: a core busy,
#: bytes flowing out, the GPU idle. They stay host_compute_bound, whose summary says so
#: (D2H_AMBIGUOUS_BYTES_PER_SECOND).
D2H_TX_PER_OFF_BYTES_PER_SECOND = float(4 * 2**30)
#: host_compute_bound with TX at least this per idle second, one way out (D2H_TX_PER_RX): the summary says that the
#: host may be copying the output rather than working on it, which gpuwarden cannot tell apart.
D2H_AMBIGUOUS_BYTES_PER_SECOND = float(2**30)
#: Share of the window in held_idle / starved that makes the verdict.
HELD_IDLE_MIN = 0.5
#: Starved (idle while the job works on input) this share of the window or more: input bound. At a quarter of the
#: time idle, a faster input pipeline gains a third more throughput, more than any compute-side remedy typically
#: does, so "nothing blocks the GPU" would be wrong advice; a loader that keeps up leaves the GPU idle only
#: between steps (1% in the compute-bound recording).
STARVED_MIN = 0.25
#: A GPU that mostly works (its verdict says what limits its kernels) but idles while its job works on the CPU this
#: share of the window or more (starved: an evaluation with host-side metrics, logging, input made between steps)
#: gets the finding host_phase with that share: under STARVED_MIN it does not decide the verdict, and a fifth of it
#: (2%) is the gap between steps of the compute-bound recordings.
HOST_PHASE_MIN = 0.10
#: Throttled: clock-event reasons present this share of the time, SM clock below this share of its maximum.
THROTTLE_MIN_FRACTION = 0.5
THROTTLE_CLOCK_RATIO = 0.9
#: Used / total GPU memory above this: memory nearly full; GpuMemoryAlmostFull's ``memory_full_ratio``.
MEMORY_FULL_RATIO = float(ALERT_PARAMS["memory_full_ratio"])
#: Host compute bound: the GPU idles while its job works on the CPU (as for input_starved), and the job moves at least
#: this many bytes device-to-host per byte host-to-device (GPM PCIe TX / RX). Input prepared on the host flows to the
#: GPU (RX far above TX); work that consumes the GPU's output on the host - an optimizer stepped on the CPU, as
#: CPU-offloaded optimizers do (ZeRO-Offload: Ren et al., USENIX ATC 2021: gradients out, parameters back, TX about
#: RX), metrics computed on the host - sends at least as much back.
HOST_TX_PER_RX = 1.0
#: ... and at least this much device-to-host traffic (bytes/s): below it, the direction of a trickle says nothing.
HOST_TX_MIN_BYTES_PER_SECOND = 100e6
#: Fewer accounted seconds than this in the window: no verdict yet.
MIN_SECONDS = 2.0

#: Clock-event reasons that slow the clocks (NVML nvmlClocksEventReason*): "power" ones are expected at full
#: load; the others mean cooling, power delivery or a hardware fault.
POWER_REASONS = clock_event_reasons("power")
SEVERE_REASONS = clock_event_reasons("thermal", "hardware")
