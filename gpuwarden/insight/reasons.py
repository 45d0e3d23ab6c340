"""Every reason the diagnosis can give (``REASON_TABLE``: severity, remedies) and the order in which the verdict
rules are tried (``VERDICT_ORDER``: the first that holds is the verdict). docs/scores.md's rule table is generated
from them (``rule_table``; ``python3 -m gpuwarden.docs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.insight.gpu_window import GpuWindow
from gpuwarden.insight.rules import RULES, Facts, Rule


@dataclass(frozen=True)
class Reason:
    """One reason of the diagnosis: ``name`` (a gpu_diagnosis reason label), ``severity`` (ok, info, warning,
    critical) and ``remedies`` (what to do, most useful first)."""

    name: str
    severity: str
    remedies: tuple[str, ...]


#: The verdict rules in the order they are tried: the first that holds for a window is its verdict. Cheap and
#: decisive tests first (no process, a job starting, copies, a server waiting, nobody working), then what limits a
#: working GPU from outside (clocks, peers, the host, storage, launches, pauses, input), then what limits it inside
#: (HBM, arithmetic); the last always holds.
VERDICT_ORDER: tuple[str, ...] = (
    "free",
    "allocated_idle",
    "starting",
    "h2d_copy_bound",
    "d2h_copy_bound",
    "serving_idle",
    "serving",
    "held_idle",
    "throttled",
    "waiting_on_peers",
    "host_compute_bound",
    "checkpoint_bound",
    "launch_bound",
    "job_paused",
    "input_starved",
    "memory_bound",
    "compute_bound",
    "underutilized",
)

#: Every reason a GPU can be given, in the order gpu_diagnosis{reason} lists them: its severity and what to do. A
#: verdict is in VERDICT_ORDER and has a rule (gpuwarden.insight.rules.RULES); any other reason is a finding
#: reported next to a verdict (or ``gpu_lost``, from ``lost``).
REASON_TABLE: tuple[Reason, ...] = (
    Reason(
        "compute_bound",
        "ok",
        (
            "Nothing blocks the GPU. To go faster: mixed precision (bf16/fp8), larger batches, fused kernels, "
            "or more GPUs.",
        ),
    ),
    Reason(
        "memory_bound",
        "ok",
        (
            "The kernels run at HBM bandwidth: cut bytes moved - fuse elementwise chains (torch.compile), keep data "
            "in bf16/fp8 instead of fp32, avoid needless copies (.contiguous(), .clone(), device-to-device copies).",
            "Raise arithmetic intensity: larger matrix tiles or batches; FlashAttention-style fused kernels.",
        ),
    ),
    Reason(
        "input_starved",
        "warning",
        (
            "Move input work off the training loop: DataLoader(num_workers=N, pin_memory=True, "
            "persistent_workers=True, prefetch_factor>=2).",
            "Do decoding and augmentation on the GPU (NVIDIA DALI, torchvision.transforms.v2 on CUDA tensors).",
            "Cache preprocessed data; check that the job was given enough CPU cores (cgroup cpu.max, Slurm "
            "--cpus-per-task, Kubernetes CPU limits).",
            "Input from remote storage: more loader workers and a deeper prefetch, larger requests, a local cache "
            "of the dataset (node-local NVMe).",
            "If the training process spends the time on the GPU's output instead (evaluation metrics, ranking, "
            "logging on the host): compute them on the GPU and copy scalars, evaluate less often or in another "
            "process.",
        ),
    ),
    Reason(
        "h2d_copy_bound",
        "warning",
        (
            "Copy from pinned memory: pin_memory=True in the DataLoader, or tensor.pin_memory() once; then "
            ".to(device, non_blocking=True) to overlap copies with compute.",
            "Keep data on the GPU across steps; send compact dtypes (uint8 images, not float32) and convert there.",
        ),
    ),
    Reason(
        "d2h_copy_bound",
        "warning",
        (
            "Keep results on the GPU: compute metrics and reductions there (torch ops, torchmetrics on CUDA tensors) "
            "and copy out one summary per step, not whole outputs; avoid .cpu()/.item()/.numpy() inside the loop.",
            "Copy into a preallocated pinned buffer with .to('cpu', non_blocking=True) on a side stream, and wait on "
            "its event only when the host needs the values (the next step overlaps the copy).",
            "Copy less: reduce before copying (argmax, top-k, a histogram), compact dtypes (bf16/uint8, not fp32).",
        ),
    ),
    Reason(
        "serving_idle",
        "warning",
        (
            "Scale the server to zero while nobody asks (KServe/Knative min replicas 0, Ray Serve autoscaling "
            "downscale, a Kubernetes HPA or KEDA on the request rate), or stop it and free the GPU.",
            "Share the GPU with other models or servers (Triton's or vLLM's multi-model serving, MPS, a MIG slice "
            "sized to the model and its KV cache).",
        ),
    ),
    Reason(
        "serving",
        "warning",
        (
            "Size the server to its load: scale replicas with the request rate and to zero between bursts "
            "(KServe/Knative min replicas 0, Ray Serve autoscaling, a Kubernetes HPA on the request rate).",
            "Share the GPU: several models or servers on one GPU (Triton's or vLLM's multi-model serving, MPS), or a "
            "MIG slice sized to the model and its KV cache instead of a whole GPU.",
            "Batch the requests that arrive (dynamic or continuous batching), and preallocate no more KV cache than "
            "the traffic needs (vLLM --gpu-memory-utilization).",
        ),
    ),
    Reason(
        "held_idle",
        "warning",
        (
            "The GPU's memory is held but nothing runs: end the idle process (notebook kernel, stopped job) or "
            "release memory (del tensors; torch.cuda.empty_cache()).",
            "Schedulers: reclaim idle GPUs (JupyterHub culling, Slurm/Kubernetes idle-GPU policies).",
        ),
    ),
    Reason(
        "allocated_idle",
        "warning",
        (
            "A scheduler gave this GPU to a job that never opened it: ask for the GPUs the job uses (Slurm "
            "--gres=gpu:N / --gpus, Kubernetes nvidia.com/gpu limits); a job that uses one of four GPUs keeps three "
            "from everyone.",
            "Check how the job picks its devices: a launcher that starts fewer ranks than GPUs (torchrun "
            "--nproc-per-node), a hard-coded cuda:0, CUDA_VISIBLE_DEVICES narrowed in the script.",
            "Schedulers: reclaim GPUs allocated and untouched (gpuwarden reclaim, allocated_idle on its ladder).",
        ),
    ),
    Reason(
        "job_paused",
        "info",
        (
            "The job itself stops between bursts of GPU work (evaluation, checkpointing, logging, sleeps, waiting on "
            "a service): overlap them with training (asynchronous checkpointing such as torch.distributed.checkpoint "
            "async_save, evaluation on another GPU), or release the GPU while waiting.",
        ),
    ),
    Reason(
        "launch_bound",
        "warning",
        (
            "Capture the step in CUDA Graphs (torch.cuda.graphs, torch.compile(mode='reduce-overhead')) so one launch "
            "replays many kernels.",
            "Fuse small operations into larger kernels (torch.compile, fused optimizers foreach=True/fused=True) and "
            "use larger batches so each kernel fills the SMs.",
            "Remove host synchronisations in the loop (.item(), .cpu(), printing tensors).",
        ),
    ),
    Reason(
        "waiting_on_peers",
        "warning",
        (
            "This GPU spins in a collective waiting for a slower rank: fix the straggler (its own diagnosis says "
            "why), balance the input work across ranks.",
            "Check the interconnect if no rank is slow (NVLink/PCIe errors, NCCL_DEBUG=INFO).",
        ),
    ),
    Reason(
        "throttled",
        "warning",
        (
            "Clocks are held below their maximum: power cap (expected at full load; raise the limit with "
            "nvidia-smi -pl if allowed), thermal (check cooling, airflow, fan/chassis), hardware slowdown or "
            "power brake (check the power supply; nvidia-smi -q -d PERFORMANCE).",
        ),
    ),
    Reason(
        "memory_nearly_full",
        "info",
        (
            "Over 90% of GPU memory is used: expect out-of-memory errors on growth; use smaller batches, "
            "activation checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
            "fragmentation.",
        ),
    ),
    Reason(
        "host_phase",
        "info",
        (
            "Overlap or shorten what the job does on the host between GPU phases (gpu_idle_seconds_total's causes say "
            "which): metrics on the GPU with scalars copied, evaluation less often or in another process, the next "
            "input prefetched, checkpoints written asynchronously.",
        ),
    ),
    Reason(
        "tensor_cores_idle",
        "info",
        (
            "The math runs on the FP32 pipes with the tensor cores idle: enable TF32 "
            "(torch.backends.cuda.matmul.allow_tf32 = True, torch.set_float32_matmul_precision('high')) or train "
            "in bf16 with torch.autocast.",
        ),
    ),
    Reason(
        "straggler",
        "warning",
        (
            "The other GPUs of this job wait on this one: give it less work (balance shards, sequence lengths or "
            "the input pipeline across ranks) or find what slows it (its own verdict).",
        ),
    ),
    Reason(
        "hot",
        "warning",
        (
            "The GPU runs within a few degrees of its own slowdown threshold: check airflow, fans, inlet temperature "
            "and neighbouring cards before the clocks drop (nvidia-smi -q -d TEMPERATURE).",
        ),
    ),
    Reason(
        "uncorrectable_ecc",
        "critical",
        (
            "Uncorrectable memory errors since the driver loaded: drain the GPU, reset it (nvidia-smi -r) so rows are "
            "remapped, and replace it if errors return.",
        ),
    ),
    Reason(
        "xid_errors",
        "warning",
        (
            "The driver reported XID errors on this GPU: look each code up in NVIDIA's XID catalog "
            "(dmesg | grep -i xid) and follow its recovery action.",
        ),
    ),
    Reason(
        "row_remap_pending", "warning", ("A memory row remap is pending: reset the GPU to apply it (drain it first).",)
    ),
    Reason(
        "row_remap_failed",
        "critical",
        ("A row remap failed: the GPU's memory cannot be repaired in place; service the GPU.",),
    ),
    Reason(
        "underutilized",
        "info",
        (
            "No single cause dominates: profile a few steps (torch.profiler, Nsight Systems) to see where the "
            "step time goes.",
        ),
    ),
    Reason(
        "blind",
        "info",
        (
            "gpuwarden cannot see this GPU's processes or their CPU: run it in the host PID namespace (hostPID: true, "
            "or --pid=host) with /proc and the cgroup mount readable, so the diagnosis can tell input, pauses and "
            "launch overhead apart.",
        ),
    ),
    Reason(
        "gpu_lost",
        "critical",
        (
            "The GPU does not answer (NVML_ERROR_GPU_IS_LOST: fallen off the bus, XID 79): drain the node, check "
            "dmesg for XID 79 and PCIe/power errors, reset the GPU (nvidia-smi -r) or reboot; replace it if it recurs.",
        ),
    ),
    Reason(
        "host_compute_bound",
        "warning",
        (
            "Work on the host consumes the GPU's output while the GPU waits: keep the optimizer step on the GPU "
            "(fused AdamW) where memory allows, or overlap the host step with the next forward and backward "
            "(DeepSpeed ZeRO-Offload's delayed parameter update, overlap_comm).",
            "Compute metrics on the GPU and copy scalars, not whole outputs; log every N steps.",
            "Where the host copies the output (.cpu() into fresh pageable memory): copy into a preallocated pinned "
            "buffer with non_blocking=True on a side stream, overlapped with the next step.",
        ),
    ),
    Reason(
        "checkpoint_bound",
        "warning",
        (
            "Checkpoint without stopping the GPU: asynchronous checkpointing (torch.distributed.checkpoint.async_save, "
            "a background thread writing a host copy), or checkpoint less often.",
            "Write to faster storage (local NVMe, then copy off), shard the checkpoint across ranks.",
        ),
    ),
    Reason("free", "ok", ("No process holds this GPU: it is available.",)),
    Reason(
        "starting",
        "ok",
        (
            "Nothing to do while a job starts. A start-up that takes minutes costs GPU time at every start and "
            "restart: cache the model and dataset on local storage, keep compile caches (TORCHINDUCTOR_CACHE_DIR, "
            "torch.compile's mega-cache), and import and build before the GPU is allocated where the scheduler "
            "allows.",
        ),
    ),
)


#: Derived from REASON_TABLE: the reason names, each one's severity and remedies.
REASONS = tuple(r.name for r in REASON_TABLE)
SEVERITY = {r.name: r.severity for r in REASON_TABLE}
REMEDIES: dict[str, tuple[str, ...]] = {r.name: r.remedies for r in REASON_TABLE}
#: The verdict rules in VERDICT_ORDER.
VERDICT_RULES: tuple[tuple[str, Rule], ...] = tuple((name, RULES[name]) for name in VERDICT_ORDER)


def verdict_of(w: GpuWindow, peers: Sequence[GpuWindow]) -> str:
    """Return the first verdict of VERDICT_ORDER whose rule holds for window ``w`` (``peers``: the other GPUs of its
    job), without its summary. Raises nothing."""
    return verdict_of_facts(Facts(w, peers))


def verdict_of_facts(facts: Facts) -> str:
    """``verdict_of`` for the window and peers of ``facts``."""
    return next(n for n, r in VERDICT_RULES if r.when is None or r.when(facts))


def first_verdict(w: GpuWindow, peers: Sequence[GpuWindow]) -> tuple[str, str]:
    """Return the first verdict of VERDICT_ORDER whose rule holds for window ``w`` (``peers``: the other GPUs of its
    job), and its one-line summary. Raises nothing (``underutilized`` always holds)."""
    facts = Facts(w, peers)
    name, rule = next((n, r) for n, r in VERDICT_RULES if r.when is None or r.when(facts))
    return name, rule.summary(facts)


def rule_table() -> str:
    """Return the verdict rule table of docs/scores.md (Markdown, one row per verdict in VERDICT_ORDER, ``gpu_lost``
    before the last resort), from RULES."""
    rows = ["| # | verdict | rule | source of the numbers |", "|---|---|---|---|"]
    for i, (name, rule) in enumerate(VERDICT_RULES, start=1):
        if name == VERDICT_ORDER[-1]:
            rows.append(
                "| - | `gpu_lost` | the GPU could not be read at all this poll (NVML_ERROR_GPU_IS_LOST: off the bus), "
                "critical | [NVML] |"
            )
        rows.append(f"| {i} | `{name}` | {rule.text} | {rule.grounds} |")
    return "\n".join(rows) + "\n"
