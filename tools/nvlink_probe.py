#!/usr/bin/env python3
"""What NVML tells of each GPU's NVLink links and fabric on this machine, and what each call costs: per-link
state, remote device, version, the data-link error counters (nvmlDeviceGetNvLinkErrorCounter: replay, recovery,
CRC flit, CRC data, ECC data), the per-link field values (the ``_L<n>`` fields up to link 11, and the scoped
``NVML_FI_DEV_NVLINK_*`` fields read with ``scopeId`` = link, Blackwell's link-recovery and error-rate counters among
them) and the fabric (nvmlDeviceGetGpuFabricInfoV: state, status, clique, cluster UUID, health mask). Prints one JSON
document.

    python3 tools/nvlink_probe.py [--traffic SECONDS]

``--traffic`` runs an all-reduce between every GPU (PyTorch and NCCL, NVLink multicast off) for that long and reads
the counters before and after, so that a counter that moves with traffic shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import pynvml


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except pynvml.NVMLError as exc:
        out = f"error: {exc}"
    return out, (time.perf_counter() - t0) * 1e6


def _fields(handle: Any, ids: list[tuple[int, int]]) -> dict[str, Any]:
    names = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_FI_DEV_NVLINK") and isinstance(v, int)}
    t0 = time.perf_counter()
    try:
        values = pynvml.nvmlDeviceGetFieldValues(handle, ids)
    except pynvml.NVMLError as exc:
        return {"error": str(exc)}
    us = (time.perf_counter() - t0) * 1e6
    out: dict[str, Any] = {"_microseconds": round(us, 1)}
    for (fid, scope), fv in zip(ids, values, strict=True):
        key = f"{names.get(fid, fid)}@{scope}"
        if fv.nvmlReturn != pynvml.NVML_SUCCESS:
            out[key] = f"error {fv.nvmlReturn}"
            continue
        vt = fv.valueType
        v = fv.value
        out[key] = {0: v.dVal, 1: v.uiVal, 2: v.ulVal, 3: v.ullVal, 4: v.sllVal, 5: v.siVal}.get(vt, f"type {vt}")
    return out


def _isolated(index: int, ids: list[tuple[int, int]]) -> Any:
    """``_fields`` of GPU ``index`` in a child process: its answer, or how the child ended."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import json, sys, pynvml; sys.path.insert(0, {here!r}); import nvlink_probe as p; pynvml.nvmlInit(); "
        f"print(json.dumps(p._fields(pynvml.nvmlDeviceGetHandleByIndex({index}), {ids!r}), default=str))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        return f"child ended with {res.returncode}: {res.stderr[-300:]}"
    return json.loads(res.stdout)


def probe(handle: Any) -> dict[str, Any]:
    """Everything NVML answers of one GPU's links and fabric, with the cost of each kind of call (µs)."""
    out: dict[str, Any] = {"name": pynvml.nvmlDeviceGetName(handle)}
    step = lambda what: print(f"probe: {what}", file=sys.stderr, flush=True)  # noqa: E731 - where a crash happened
    step("link count")
    count = _fields(handle, [(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)])
    out["link_count_field"] = count
    links: dict[str, Any] = {}
    for link in range(18):
        step(f"link {link}")
        state, us = _timed(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        entry: dict[str, Any] = {"state": state, "state_us": round(us, 1)}
        if isinstance(state, str):
            links[str(link)] = entry
            continue
        entry["version"] = _timed(pynvml.nvmlDeviceGetNvLinkVersion, handle, link)[0]
        for counter in ("DL_REPLAY", "DL_RECOVERY", "DL_CRC_FLIT", "DL_CRC_DATA", "DL_ECC_DATA"):
            value, us = _timed(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link,
                               getattr(pynvml, f"NVML_NVLINK_ERROR_{counter}"))  # fmt: skip
            entry[counter] = value
            entry[f"{counter}_us"] = round(us, 1)
        links[str(link)] = entry
    out["links"] = links
    scoped = [
        getattr(pynvml, n)
        for n in dir(pynvml)
        if n.startswith("NVML_FI_DEV_NVLINK_COUNT_")
        or re.match(r"NVML_FI_DEV_NVLINK_(ERROR_DL_(REPLAY|RECOVERY|CRC)|GET_(STATE|SPEED|VERSION))$", n)
    ]
    step("scoped fields (each batch in a child process: one of them crashed NVML on a Hopper driver)")
    index = pynvml.nvmlDeviceGetIndex(handle)
    dl = [f for f in scoped if f < 200]
    count_fields = [f for f in scoped if f >= 200]
    out["scoped_dl_fields_link0"] = _isolated(index, [(f, 0) for f in dl])
    out["scoped_dl_fields_link1"] = _isolated(index, [(f, 1) for f in dl])
    out["scoped_count_fields_link0"] = _isolated(index, [(f, 0) for f in count_fields])
    per_link = [
        getattr(pynvml, n)
        for n in dir(pynvml)
        if re.match(r"NVML_FI_DEV_NVLINK_(REPLAY|RECOVERY|CRC_FLIT|CRC_DATA)_ERROR_COUNT_L(0|1|11)$", n)
    ]
    totals = [getattr(pynvml, n) for n in dir(pynvml) if re.match(r"NVML_FI_DEV_NVLINK_\w+_COUNT_TOTAL$", n)]
    step("_L fields")
    out["l_fields"] = _isolated(index, [(f, 0) for f in per_link + totals])
    step("fabric")
    fabric, us = _timed(_fabric, handle)
    out["fabric"] = fabric
    out["fabric_us"] = round(us, 1)
    return out


def _fabric(handle: Any) -> Any:
    """nvmlDeviceGetGpuFabricInfoV with the v3 struct (health mask and summary), passed by reference: pynvml's
    wrapper hands the struct on as it is given, and a struct passed by value crashes the process."""
    import ctypes

    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    info.version = pynvml.nvmlGpuFabricInfo_v3
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    out = {}
    for name, _ in info._fields_:
        value = getattr(info, name)
        out[name] = bytes(value).hex() if name == "clusterUuid" else int(value)
    return out


def traffic(seconds: float) -> str:
    """An all-reduce on every GPU for ``seconds`` (a child process per GPU, NCCL, NVLink multicast off)."""
    script = (
        "import os, time, torch, torch.distributed as d\n"
        "d.init_process_group('nccl'); r = d.get_rank(); torch.cuda.set_device(r)\n"
        "x = torch.ones(256 * 2**20, device='cuda'); n = int(float(os.environ['SECONDS_']) * 100)\n"
        "t0 = time.time()\n"
        "for i in range(n):\n    d.all_reduce(x)\n    if i % 50 == 49: torch.cuda.synchronize()\n"
        "torch.cuda.synchronize(); print(r, 'all-reduces', n, 'of 1 GiB in', round(time.time() - t0, 1), 's')\n"
        "d.destroy_process_group()\n"
    )
    pynvml.nvmlInit()
    gpus = pynvml.nvmlDeviceGetCount()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the machine's own torch and its packages
    env.update(SECONDS_=str(seconds), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")  # fmt: skip
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", f.name]
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60, check=False)
        return (res.stdout + res.stderr)[-800:]
    except subprocess.TimeoutExpired as exc:
        return f"timed out: {str(exc.stderr or '')[-600:]}"
    finally:
        os.unlink(f.name)


def main() -> int:
    """Probe every GPU (before and after traffic with ``--traffic``) and print the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traffic", type=float, default=0.0)
    args = ap.parse_args()
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    doc: dict[str, Any] = {"driver": pynvml.nvmlSystemGetDriverVersion(), "before": [probe(h) for h in handles]}
    print(json.dumps(doc, indent=1, default=str), file=sys.stderr, flush=True)  # kept should the rest fail
    if args.traffic > 0:
        doc["traffic"] = traffic(args.traffic)
        doc["after"] = [probe(h) for h in handles]
    print(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
