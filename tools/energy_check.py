#!/usr/bin/env python3
"""Checks the NVML energy counter, and gpuwarden's ``gpu_energy_joules_total``, against the GPU's power over time.

    python3 tools/energy_check.py --url http://127.0.0.1:10400 [--gpu 0] [--json OUT]

While a running gpuwarden daemon (``--url``) serves the GPU, this runs a load pattern on it with PyTorch (idle,
full matrix products, products half the time, idle) and samples, ten times a second, the board's instant power
(``NVML_FI_DEV_POWER_INSTANT``), its averaged power (``nvmlDeviceGetPowerUsage``) and the energy counter
(``nvmlDeviceGetTotalEnergyConsumption``), and scrapes the daemon every second. For each phase and the whole run it
prints the counter's growth against the integral of each power reading (trapezoids), and the daemon's exported
counter's growth against the integral of its exported power, the same comparison its users make in PromQL
(``increase(gpu_energy_joules_total[w])`` vs ``avg_over_time(gpu_power_usage_watts[w]) * w``). A measurement tool,
outside gpuwarden's NVML layer: it reads NVML itself, at a rate the daemon never does.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from typing import Any

import httpx

#: (phase, seconds, share of each 100 ms spent in matrix products)
PHASES = (("idle", 15.0, 0.0), ("full", 30.0, 1.0), ("half", 30.0, 0.5), ("idle-after", 15.0, 0.0))


def _sampler(gpu: int, stop: threading.Event, out: list[tuple[float, float, float, float]]) -> None:
    """Append (time s, instant W, average W, energy J) every 100 ms until ``stop``."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    while not stop.is_set():
        t = time.time()
        [inst] = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT])
        instant = inst.value.uiVal / 1000 if inst.nvmlReturn == 0 else float("nan")
        avg = pynvml.nvmlDeviceGetPowerUsage(h) / 1000
        energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000
        out.append((t, instant, avg, energy))
        stop.wait(0.1)
    pynvml.nvmlShutdown()


def _scraper(url: str, gpu: int, stop: threading.Event, out: list[tuple[float, float, float]]) -> None:
    """Append (time s, gpu_energy_joules_total, gpu_power_usage_watts) of GPU ``gpu`` every second until ``stop``."""
    pat = {m: re.compile(rf'^{m}{{[^}}]*gpu="{gpu}"[^}}]*}} (\S+)', re.M)
           for m in ("gpu_energy_joules_total", "gpu_power_usage_watts")}  # fmt: skip
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            t = time.time()
            text = client.get(f"{url}/metrics").text
            e, p = (pat[m].search(text) for m in pat)
            if e and p:
                out.append((t, float(e.group(1)), float(p.group(1))))
            stop.wait(1.0)


def _load(gpu: int, marks: list[tuple[str, float, float]]) -> None:
    """Run PHASES on the GPU; record (phase, start, end) in ``marks``."""
    import torch

    dev = torch.device(f"cuda:{gpu}")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(dev)
    for name, seconds, duty in PHASES:
        start = time.time()
        while time.time() - start < seconds:
            tick = time.time()
            while time.time() - tick < 0.1 * duty:
                for _ in range(4):
                    a @ b
                torch.cuda.synchronize(dev)
            rest = 0.1 - (time.time() - tick)
            if rest > 0:
                time.sleep(rest)
        marks.append((name, start, time.time()))


def _integral(points: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Trapezoid integral of (t, value) points within [t0, t1]."""
    inside = [(t, v) for t, v in points if t0 <= t <= t1 and v == v]
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(inside, inside[1:], strict=False))


def _growth(points: list[tuple[float, float]], t0: float, t1: float) -> tuple[float, float]:
    """(growth, seconds) between the first and last points within [t0, t1]."""
    inside = [(t, v) for t, v in points if t0 <= t <= t1]
    return inside[-1][1] - inside[0][1], inside[-1][0] - inside[0][0]


def main() -> int:
    """Run the check; print a table and, with --json, write the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the daemon, e.g. http://127.0.0.1:10400")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    stop = threading.Event()
    nvml: list[tuple[float, float, float, float]] = []
    scraped: list[tuple[float, float, float]] = []
    threads = [threading.Thread(target=_sampler, args=(args.gpu, stop, nvml)),
               threading.Thread(target=_scraper, args=(args.url, args.gpu, stop, scraped))]  # fmt: skip
    for th in threads:
        th.start()
    time.sleep(2)
    marks: list[tuple[str, float, float]] = []
    _load(args.gpu, marks)
    time.sleep(12)  # the daemon's slow read after the last phase
    stop.set()
    for th in threads:
        th.join()
    rows: list[dict[str, Any]] = []
    whole = ("whole run", marks[0][1], marks[-1][2])
    for name, t0, t1 in [*marks, whole]:
        energy, span = _growth([(t, e) for t, _, _, e in nvml], t0, t1)
        inside = [x for x in nvml if t0 <= x[0] <= t1]
        lo, hi = inside[0][0], inside[-1][0]
        instant = _integral([(t, p) for t, p, _, _ in nvml], lo, hi)
        average = _integral([(t, p) for t, _, p, _ in nvml], lo, hi)
        rows.append({"phase": name, "seconds": round(span, 2), "nvml_energy_j": round(energy, 1),
                     "instant_power_integral_j": round(instant, 1), "average_power_integral_j": round(average, 1),
                     "counter_over_instant": round(energy / instant, 4) if instant else None,
                     "counter_over_average": round(energy / average, 4) if average else None,
                     "mean_instant_w": round(instant / span, 1) if span else None})  # fmt: skip
    # the daemon's series, over windows of 30 s and 60 s, as PromQL would compare them
    daemon = []
    for w in (30.0, 60.0, hi - lo):
        t_end = scraped[-1][0]
        e, span = _growth([(t, e) for t, e, _ in scraped], t_end - w, t_end)
        power = [p for t, _, p in scraped if t_end - w <= t <= t_end]
        mean = sum(power) / len(power)
        ratio = round(e / (mean * span), 4) if span and mean else None
        daemon.append({"window_s": round(w, 1), "counter_growth_j": round(e, 1), "mean_power_w": round(mean, 1),
                       "growth_over_mean_power_x_span": ratio})  # fmt: skip
    head = ("phase", "s", "counter J", "instant J", "avg J", "c/inst", "c/avg", "W")
    print("  ".join(f"{h:>10}" for h in head))
    keys = ("phase", "seconds", "nvml_energy_j", "instant_power_integral_j", "average_power_integral_j",
            "counter_over_instant", "counter_over_average", "mean_instant_w")  # fmt: skip
    for r in rows:
        print("  ".join(f"{r[k]:>10}" for k in keys))
    for d in daemon:
        print(
            f"daemon, last {d['window_s']:.0f} s: counter +{d['counter_growth_j']} J, mean power "
            f"{d['mean_power_w']} W: growth / (mean power x span) = {d['growth_over_mean_power_x_span']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"phases": rows, "daemon": daemon}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
