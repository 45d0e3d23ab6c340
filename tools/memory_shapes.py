"""Memory shapes against the memory page: every leak paged before full, no healthy shape paged.

Writes GPU memory shapes of our own (leaks: linear from a job's start or after a plateau, staircases of several
step sizes and periods, leaks under allocator noise, accelerating leaks; healthy: warm-ups of 1 to 30 minutes,
linear, exponential and stepped, jobs that start at 95-99%, a job replaced by a bigger one, noisy plateaus, eval
phases that come and go), runs them through the rules with the real ``promtool test rules`` (one evaluation a
minute, or at --interval), and prints, per shape, when GpuMemoryFillingUp first fired, when the memory was full
and the minutes of warning in between; for healthy shapes, the minutes it fired (must be none).

Run: python3 tools/memory_shapes.py [--rules alerts/tests/memory.rules.yml] [--interval 60] [--only PREFIX]
(exit 1 when a leak is not paged before full or a healthy shape is paged; tests/test_memory_shapes.py runs it).
"""

from __future__ import annotations

import argparse
import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "tests" / "memory.rules.yml"
ALERT = "GpuMemoryFillingUp"
TOTAL = 100.0  # the shapes are in percent of the memory: promtool's numbers need no unit
IDLE = 0.6  # an H100 with no process reads 0.5-0.6 GiB of 80 "used" (the driver's own)
#: A leak full before its job is this old is inside the warm-up the rules assume (memory_warmup, 30 minutes, plus
#: the ramp's seven): growth that young cannot be told from a warm-up, so it is reported apart, not as a miss.
YOUNG = 37.0
#: A leak full within this many minutes of the start of its growth after a plateau grows no longer than an evaluation
#: phase the ramp waits out (five one-minute windows and ``for:``): it cannot be told from that phase's first minutes,
#: so it is reported apart, not as a miss.
FAST = 9.0


@dataclass(frozen=True)
class Shape:
    """One GPU's memory over time. ``level(t)`` is the percentage used at minute ``t`` (None: no sample, the GPU
    was not yet watched); ``leak`` shapes must page before ``full_at`` (the first minute at 100%); healthy ones
    never. ``start_age`` is the age in minutes of the job's largest process at minute 0 where the exporter knows
    it (None: no process series, memory alone)."""

    name: str
    leak: bool
    level: Callable[[float], float | None]
    minutes: int
    start_age: float | None = None
    job_start: float = 0.0  # the minute the leaking job started (its warm-up began)
    guarantee: float = 0.0  # minutes of warning before full that the rules promise this shape (docs/runbook.md)
    growth_start: float | None = None  # the minute a leak after a plateau starts to grow
    #: a second job on the GPU: the minute it starts and its own memory (percent) from then, part of ``level``
    second: tuple[float, Callable[[float], float]] | None = None

    def values(self, step: float) -> list[float | None]:
        """Samples every ``step`` minutes from minute 0 to ``minutes``, clipped to [0, 100]."""
        out: list[float | None] = []
        for i in range(int(self.minutes / step) + 1):
            v = self.level(i * step)
            out.append(None if v is None else min(TOTAL, max(0.0, v)))
        return out

    @property
    def full_at(self) -> float | None:
        """First minute (0.25 resolution) the memory reaches 100%, None if never."""
        for i in range(int(self.minutes * 4) + 1):
            v = self.level(i / 4)
            if v is not None and v >= TOTAL:
                return i / 4
        return None


def _clip(v: float) -> float:
    return min(TOTAL, max(0.0, v))


def _noise(seed: int, amplitude: float) -> Callable[[float], float]:
    """Deterministic allocator noise: uniform in +-amplitude, a new draw every 15 s."""
    rng = random.Random(seed)
    draws = [rng.uniform(-amplitude, amplitude) for _ in range(4 * 24 * 60)]
    return lambda t: draws[int(t * 4) % len(draws)]


def _ramp(start: float, end: float, t0: float, duration: float, kind: str = "linear") -> Callable[[float], float]:
    """From ``start`` at ``t0`` to ``end`` over ``duration`` minutes, then flat: linear, exponential (90% of the
    way in the first half) or in four equal steps."""

    def f(t: float) -> float:
        if t <= t0:
            return start
        x = min(1.0, (t - t0) / duration) if duration > 0 else 1.0
        if kind == "exp":
            k = -math.log(0.1) / (duration / 2) if duration > 0 else 1.0
            x = min(1.0, (1 - math.exp(-k * (t - t0))) / (1 - math.exp(-k * duration))) if duration > 0 else 1.0
        elif kind == "steps":
            x = min(1.0, math.floor(x * 4 + 1e-9) / 4) if x < 1 else 1.0
        return start + (end - start) * x

    return f


def _phase(t: float, first: float, period: float, plateau: float, rate: float, rise: float, hold: float) -> float:
    """An evaluation phase every ``period`` minutes from minute ``first``: ``rate`` percent a minute for ``rise``
    minutes above ``plateau``, held for ``hold`` minutes, then released to the plateau."""
    if t < first:
        return plateau
    x = (t - first) % period
    return plateau + rate * min(x, rise) if x < rise + hold else plateau


def _with_prefix(idle_minutes: float, f: Callable[[float], float]) -> Callable[[float], float]:
    """An idle GPU for ``idle_minutes``, then the job (``f`` in the job's own minutes)."""
    return lambda t: IDLE if t < idle_minutes else f(t - idle_minutes)


def from_start_guarantee(to_full: float) -> float:
    """Minutes of warning promised to a smooth leak that grows from its job's start and is full ``to_full``
    minutes later: it is paged by minute 42 of its job (past the warm-up, four ramp windows and ``for:``), and 55
    minutes ahead of full when it is slower than that (the trend's one-hour horizon)."""
    return max(0.0, min(55.0, to_full - 42))


def after_plateau_guarantee(to_full: float) -> float:
    """Minutes of warning promised to a smooth leak that starts after its job held a steady level past its
    warm-up and is full ``to_full`` minutes later: paged 8 minutes into the ramp at the latest (six one-minute
    windows and ``for:``), and 12 minutes ahead when it takes 20 minutes or more; 55 minutes ahead when it takes
    90 or more."""
    return max(min(12.0, to_full - 8), min(55.0, to_full - 35), 0.0)


def leaks() -> list[Shape]:
    """Leak shapes: each must page before the memory is full."""
    out: list[Shape] = []
    # linear leaks from the job's start (the series starts with the job), and after an idle hour
    for start in (40, 60, 80):
        for to_full in (45, 60, 90, 180):
            rate = (TOTAL - start) / to_full
            promise = from_start_guarantee(to_full)
            out.append(Shape(f"linear-from-start-{start}-full-{to_full}m", True,
                             lambda t, s=start, r=rate: s + r * t, to_full + 30, guarantee=promise))  # fmt: skip
            out.append(Shape(f"linear-after-idle-{start}-full-{to_full}m", True,
                             _with_prefix(60, lambda t, s=start, r=rate: s + r * t), 60 + to_full + 30,
                             job_start=60, guarantee=promise))  # fmt: skip
    # a job at a steady level for an hour (warm-up done), then a leak: fast and slow
    for plateau in (50, 70, 82, 90):
        for to_full in (6, 12, 20, 40, 90, 240):
            if plateau < 70 and to_full < 12:
                continue
            rate = (TOTAL - plateau) / to_full
            out.append(Shape(f"after-plateau-{plateau}-full-{to_full}m", True,
                             lambda t, p=plateau, r=rate: p if t < 60 else p + r * (t - 60), 60 + to_full + 20,
                             guarantee=after_plateau_guarantee(to_full), growth_start=60))  # fmt: skip
    # per-epoch staircases from a job's start: step sizes and periods
    for start, step, period in ((60, 4, 8), (60, 2, 5), (50, 8, 15), (70, 1, 2), (40, 5, 10), (60, 10, 30),
                                (80, 2, 8), (50, 3, 20)):  # fmt: skip
        to_full = math.ceil((TOTAL - start) / step) * period
        out.append(Shape(f"staircase-{start}+{step}every{period}m", True,
                         lambda t, s=start, st=step, p=period: s + st * math.floor(t / p), to_full + 20,
                         guarantee=period))  # fmt: skip
    # leaks under allocator noise
    for seed, (start, to_full, amp) in enumerate(((45, 55, 2), (70, 55, 2), (60, 90, 3), (50, 40, 1), (80, 120, 2))):
        noise = _noise(seed, amp)
        rate = (TOTAL - start) / to_full
        out.append(Shape(f"noisy-{start}-full-{to_full}m-pm{amp}", True,
                         lambda t, s=start, r=rate, n=noise: s + r * t + n(t), to_full + 20))  # fmt: skip
    # a noisy plateau, then a leak
    noise = _noise(99, 2)
    out.append(Shape("noisy-plateau-75-then-full-in-30m", True,
                     lambda t, n=noise: 75 + n(t) + (0 if t < 60 else 25 * (t - 60) / 30), 110,
                     guarantee=10))  # fmt: skip
    # an accelerating leak (a cache without a cap: each step adds more)
    out.append(Shape("accelerating-from-60-full-60m", True, lambda t: 60 + 40 * (t / 60) ** 2, 80, guarantee=10))
    return out


def healthy() -> list[Shape]:
    """Healthy shapes: none may page."""
    out: list[Shape] = []
    for kind in ("linear", "exp", "steps"):
        for start, end, duration in ((30, 93, 25), (30, 93, 10), (10, 97, 30), (60, 95, 20), (0.6, 90, 5),
                                     (40, 99, 15), (20, 93, 1), (50, 96, 30)):  # fmt: skip
            f = _ramp(start, end, 0, duration, kind)
            out.append(Shape(f"warmup-{kind}-{start}-{end}-in-{duration}m", False, f, 150))
            out.append(Shape(f"warmup-{kind}-{start}-{end}-in-{duration}m-after-idle", False,
                             _with_prefix(45, f), 195))  # fmt: skip
    for level in (95, 97, 99):
        out.append(Shape(f"starts-at-{level}", False, lambda t, v=level: v, 120))
        out.append(Shape(f"starts-at-{level}-after-idle", False, lambda t, v=level: IDLE if t < 30 else v, 150))
        noise = _noise(level, 0.5)
        out.append(Shape(f"starts-at-{level}-noisy", False, lambda t, v=level, n=noise: v + n(t), 120))
    # a job replaced by a bigger one: the old one's memory freed (one idle sample) or not seen freed
    for old, new in ((50, 90), (70, 99), (60, 95)):
        out.append(Shape(f"replaced-{old}-by-{new}-via-idle", False,
                         lambda t, a=old, b=new: a if t < 60 else (IDLE if t < 61 else b), 150))  # fmt: skip
        out.append(Shape(f"replaced-{old}-by-{new}-at-once", False, lambda t, a=old, b=new: a if t < 60 else b, 150))
        ramp = _ramp(old, new, 60, 10)
        out.append(Shape(f"replaced-{old}-by-{new}-warming-up", False,
                         lambda t, a=old, r=ramp: a if t < 60 else (IDLE if t < 61 else r(t)), 150))  # fmt: skip
    for level, amp in ((85, 2), (90, 2), (95, 2), (92, 3)):
        noise = _noise(level + amp, amp)
        out.append(Shape(f"noisy-plateau-{level}-pm{amp}", False, lambda t, v=level, n=noise: v + n(t), 180))
    # evaluation phases: memory rises for a few minutes every 20 and is released (empty_cache) afterwards
    out.append(Shape("eval-phases-70-85-every-20m", False,
                     lambda t: 70 + (15 * min(1.0, (t % 20) / 4) if (t % 20) < 8 else 0), 180))  # fmt: skip
    # evaluation phases that grow and release: +2%/min for 5 minutes every 30, one of 15 minutes at +1%/min, +10% in
    # 4 minutes every 70 (each the first in its hour)
    out.append(Shape("eval-phases-70-+2pm-5m-every-30m", False,
                     lambda t: 70 + (2 * (t % 30) if t % 30 < 5 else (10 if t % 30 < 6 else 0)), 300))  # fmt: skip
    out.append(Shape("eval-phase-70-+1pm-15m-once", False,
                     lambda t: 70 + (min(15.0, t - 60) if 60 <= t < 76 else 0), 200))  # fmt: skip
    out.append(Shape("eval-phases-75-+10in4m-every-70m", False,
                     lambda t: 75 + (2.5 * (t % 70) if t % 70 < 4 else (10 if t % 70 < 5 else 0)), 330))  # fmt: skip
    # slow warm-ups that approach their level exponentially (each rise a fixed share of the one before), past the
    # 30-minute warm-up window: never full at their own pace
    for tau, end in ((8, 95), (12, 92), (20, 90)):
        out.append(Shape(f"warmup-exp-tau{tau}m-10-{end}", False,
                         lambda t, e=end, k=tau: e - (e - 10) * math.exp(-t / k), 200))  # fmt: skip
    # a job's first evaluation phases past its warm-up (nothing in its history above the plateau): +2-3% a minute
    # for 3-5 minutes from 80%, held 6-20 minutes, released; every 30 minutes from minute 40
    for rate, rise, hold in ((2, 5, 8), (3, 4, 6), (2.5, 4, 20), (3, 3, 12)):
        out.append(Shape(f"eval-phases-first-at-40-80-+{rate}pm-{rise}m-held-{hold}m-every-30m", False,
                         lambda t, r=rate, d=rise, h=hold: _phase(t, 40, 30, 80, r, d, h), 200))  # fmt: skip
        out.append(Shape(f"eval-phases-first-at-40-80-+{rate}pm-{rise}m-held-{hold}m-every-30m-old-job", False,
                         lambda t, r=rate, d=rise, h=hold: _phase(t, 40, 30, 80, r, d, h), 200,
                         start_age=600))  # fmt: skip
    # a second job that starts beside a steady one and warms up (linear, exponential, stepped; 3-25 minutes)
    for steady, add, duration, kind in ((40, 50, 15, "linear"), (60, 35, 25, "exp"), (30, 60, 5, "steps"),
                                        (50, 45, 3, "linear")):  # fmt: skip
        ramp = _ramp(2, add, 0, duration, kind)
        out.append(Shape(f"second-job-warmup-{kind}-+{add}-in-{duration}m-beside-{steady}", False,
                         lambda t, a=steady, g=ramp: a + (g(t - 60) if t >= 60 else 0), 180, start_age=600,
                         second=(60, ramp)))  # fmt: skip
    # a warm-up that steps once more at the first evaluation, 20 minutes in
    out.append(Shape("warmup-then-one-eval-step", False,
                     lambda t: _ramp(30, 80, 0, 10)(t) + (8 if t >= 20 else 0), 150))  # fmt: skip
    return out


def randomized(n: int, seed: int) -> list[Shape]:
    """``n`` shapes drawn at random (seeded) from the classes above with other numbers: leaks that start at a
    job's start, after its warm-up and a plateau of 35-120 minutes, smooth, stepped (steps every 1-30 minutes) or
    noisy (+-0.5-3%), filling in 6-300 minutes; warm-ups of 1-30 minutes, linear, exponential or stepped, ending at
    60-99%, with or without an idle GPU before and noise after; jobs starting at 90-99%; jobs replaced by bigger
    ones."""
    rng = random.Random(seed)
    out: list[Shape] = []
    for i in range(n):
        noise = _noise(seed * 100000 + i, rng.choice([0, 0, 0.5, 1, 2, 3]))
        if i % 2 == 0:  # a leak
            start = rng.uniform(20, 90)
            to_full = rng.choice([rng.uniform(6, 30), rng.uniform(30, 120), rng.uniform(120, 300)])
            after = rng.choice([0.0, rng.uniform(35, 120)])  # growth from the job's start, or after its plateau
            warm = _ramp(rng.uniform(1, start), start, 0, rng.uniform(1, 30), rng.choice(["linear", "exp", "steps"]))
            period = rng.choice([0.0, 0.0, rng.uniform(1, 10), rng.uniform(10, 30)])
            period = min(period, to_full / 4)  # at least four steps: one step to full warns nobody
            rate = (TOTAL - start) / to_full

            def f(t: float, a=after, s0=start, r=rate, p=period, n=noise, w=warm) -> float:
                if t < a:
                    return w(t) + n(t) if a else s0 + n(t)
                x = t - a
                if p:
                    x = p * math.floor(x / p)
                return s0 + r * x + n(t)

            full = next((k / 4 for k in range(4 * 600) if f(k / 4) >= TOTAL), 600.0)
            out.append(Shape(f"random-{i}-leak-from-{start:.0f}-after-{after:.0f}-full-in-{to_full:.0f}m-step-"
                             f"{period:.0f}", True, f, int(full) + 10))  # fmt: skip
        else:
            kind = rng.choice(["warmup", "warmup", "warmup", "start-high", "replaced"])
            idle = rng.choice([0.0, rng.uniform(5, 60)])
            if kind == "warmup":
                end = rng.uniform(60, 99)
                g = _ramp(
                    rng.uniform(0.6, end * 0.8), end, 0, rng.uniform(1, 30), rng.choice(["linear", "exp", "steps"])
                )
            elif kind == "start-high":
                g = _ramp(rng.uniform(90, 99), rng.uniform(90, 99.5), 0, rng.uniform(1, 20), "linear")
            else:
                old, new = rng.uniform(20, 70), rng.uniform(75, 99)
                g = _ramp(old, new, rng.uniform(40, 90), rng.uniform(0, 1), "linear")

            def h(t: float, d=idle, gg=g, n=noise) -> float:
                return IDLE if t < d else gg(t - d) + n(t)

            out.append(Shape(f"random-{i}-{kind}-idle-{idle:.0f}", False, h, int(idle) + 180))
    return out


#: One leak of each class for the promtool file (the issue-like ones among them): the full set runs through ``run``.
REPRESENTATIVES = (
    "linear-from-start-60-full-90m", "linear-after-idle-40-full-60m", "after-plateau-82-full-12m",
    "after-plateau-70-full-40m", "after-plateau-90-full-240m", "staircase-60+4every8m", "staircase-60+10every30m",
    "staircase-70+1every2m", "noisy-45-full-55m-pm2", "noisy-plateau-75-then-full-in-30m",
    "accelerating-from-60-full-60m",
)  # fmt: skip


def promtool_cases(step_minutes: float = 1.0) -> dict:
    """A promtool test file: each leak of ``REPRESENTATIVES`` in a test of its own, asserted firing at its full
    minute less the warning its class is promised (``Shape.guarantee``; the last minute before full where none
    is), and every healthy shape in one test, all asserted silent every five minutes (``run`` checks each minute)."""
    labels = {"severity": "critical", "instance": "n1:10400", "job": "gpuwarden", "gpu": "0"}
    interval = f"{int(step_minutes * 60)}s"
    tests = []
    for shape in leaks():
        if shape.name not in REPRESENTATIVES:
            continue
        full = shape.full_at
        assert full is not None
        at = math.floor(full - shape.guarantee) if shape.guarantee else math.ceil(full) - 1
        exp = [{"exp_labels": {**labels, "uuid": "GPU-a"}}]
        tests.append({
            "name": f"{shape.name}: paged by minute {at} ({shape.guarantee:g} min before full at {full:g})",
            "interval": interval, "input_series": _series(step_minutes, shape, "GPU-a"),
            "alert_rule_test": [{"eval_time": f"{at}m", "alertname": ALERT, "exp_alerts": exp}],
        })  # fmt: skip
    calm = healthy()
    series = [x for i, shape in enumerate(calm) for x in _series(step_minutes, shape, f"GPU-{i}")]
    end = max(shape.minutes for shape in calm)
    tests.append({
        "name": "healthy: " + ", ".join(shape.name for shape in calm) + ": never paged",
        "interval": interval, "input_series": series,
        "alert_rule_test": [{"eval_time": f"{m}m", "alertname": ALERT, "exp_alerts": []} for m in range(5, end + 1, 5)],
    })  # fmt: skip
    return {"rule_files": ["memory.rules.yml"], "evaluation_interval": "1m", "tests": tests}


def promtool_text() -> str:
    """Return ``promtool_cases()`` as the YAML of a promtool test file, with a header saying how it was made."""
    head = (
        "# Generated by tools/memory_shapes.py --write-promtool: the memory shapes of docs/runbook.md\n"
        "# (GpuMemoryFillingUp), each leak paged with the warning its class is promised, each healthy shape never.\n"
        "# Run from alerts/tests: promtool test rules memory.test.yml\n"
    )
    return head + yaml.safe_dump(promtool_cases(), sort_keys=False, width=1 << 20)


def write_promtool(path: Path) -> None:
    """Write ``promtool_text()`` to ``path``."""
    path.write_text(promtool_text())


def _go_minutes(text: str) -> float:
    """Minutes in a Go duration as promtool prints it (1h2m0s, 45m, 30s)."""
    total = 0.0
    for num, unit in re.findall(r"([\d.]+)(h|ms|m|s)", text):
        total += float(num) * {"h": 60, "m": 1, "s": 1 / 60, "ms": 1 / 60000}[unit]
    return total


def _series(step_minutes: float, shape: Shape, uuid: str) -> list[dict]:
    labels = f'instance="n1:10400",job="gpuwarden",gpu="0",uuid="{uuid}"'
    vals = shape.values(step_minutes)
    text = " ".join("_" if v is None else f"{v:.2f}" for v in vals)
    total = " ".join("_" if v is None else f"{TOTAL:g}" for v in vals)
    out = [
        {"series": f"gpu_memory_used_bytes{{{labels}}}", "values": text},
        {"series": f"gpu_memory_total_bytes{{{labels}}}", "values": total},
        # every GPU a daemon serves has gpu_up (the GPU's job record, uuid:gpu_job_holder:info, is made from it)
        {"series": f"gpu_up{{{labels}}}", "values": " ".join("_" if v is None else "1" for v in vals)},
    ]
    if shape.start_age is not None:
        start = -shape.start_age * 60
        pvals = " ".join("_" if v is None else f"{start:g}" for v in vals)
        first = text
        if shape.second is not None:
            at, own = shape.second
            minutes = [i * step_minutes for i in range(len(vals))]
            mine = [None if v is None or m < at else min(v, own(m - at)) for v, m in zip(vals, minutes, strict=True)]
            first = " ".join("_" if v is None else f"{v - (o or 0):.2f}" for v, o in zip(vals, mine, strict=True))
            out.append({"series": f'gpu_process_start_time_seconds{{{labels},pid="8",process_name="python3"}}',
                        "values": " ".join("_" if o is None else f"{at * 60:g}" for o in mine)})  # fmt: skip
            out.append({"series": f'gpu_process_memory_used_bytes{{{labels},pid="8",process_name="python3"}}',
                        "values": " ".join("_" if o is None else f"{o:.2f}" for o in mine)})  # fmt: skip
        out.append({"series": f'gpu_process_start_time_seconds{{{labels},pid="7",process_name="python3"}}',
                    "values": pvals})  # fmt: skip
        out.append({"series": f'gpu_process_memory_used_bytes{{{labels},pid="7",process_name="python3"}}',
                    "values": first})  # fmt: skip
    return out


def run(shapes: Iterable[Shape], rules: Path = RULES, interval_s: int = 60) -> dict[str, list[float]]:
    """Minutes at which ``ALERT`` was firing for each shape (evaluated once a minute), by the real promtool.

    Raises RuntimeError when promtool is missing or fails for another reason than the alerts it reports."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool not found (Debian: apt-get install prometheus)")
    shapes = list(shapes)
    step = interval_s / 60
    with tempfile.TemporaryDirectory() as tmp:
        series = [s for i, shape in enumerate(shapes) for s in _series(step, shape, f"s{i}")]
        end = max(s.minutes for s in shapes)
        test = {
            "rule_files": [str(rules)],
            "evaluation_interval": "1m",
            "tests": [{
                "name": "shapes",
                "interval": f"{interval_s}s",
                "input_series": series,
                "alert_rule_test": [{"eval_time": f"{m}m", "alertname": ALERT, "exp_alerts": []}
                                    for m in range(1, end + 1)],
            }],
        }  # fmt: skip
        path = Path(tmp) / "shapes.test.yml"
        path.write_text(yaml.safe_dump(test, width=1 << 20))
        res = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    if res.returncode != 0 and "FAILED" not in out:
        raise RuntimeError(f"promtool failed: {out[-2000:]}")
    fired: dict[str, list[float]] = {s.name: [] for s in shapes}
    for block in re.split(r"\n\s*alertname: ", out)[1:]:
        m = re.match(rf"{ALERT}, time: (\S+?),", block)
        if not m:
            continue
        minute = _go_minutes(m.group(1))
        got = block.split("got:", 1)[1] if "got:" in block else ""
        for uuid in re.findall(r'uuid="s(\d+)"', got):
            shape = shapes[int(uuid)]
            if shape.minutes >= minute:
                fired[shape.name].append(minute)
    return fired


def apart(shape: Shape) -> str:
    """Why a leak is reported apart rather than held to "paged before full" (empty: it is held to it): full within
    ``YOUNG`` minutes of its job's start (inside the warm-up), or within ``FAST`` minutes of the start of its growth
    after a plateau (as fast as an evaluation phase rises)."""
    full = shape.full_at
    if full is None:
        return ""
    if shape.growth_start is not None and full - shape.growth_start < FAST:
        return "full as fast as an evaluation phase rises"
    return "full inside its job's warm-up" if full - shape.job_start < YOUNG else ""


def report(shapes: list[Shape], fired: dict[str, list[float]]) -> tuple[list[str], list[str], list[float]]:
    """Table lines, failures (a leak not paged before full, a healthy shape paged) and the minutes of warning of
    every leak paged. A leak full within ``YOUNG`` minutes of its job's start, or within ``FAST`` minutes of the start
    of its growth after a plateau, is listed as such, not a failure."""
    lines = [f"{'shape':58} {'full at':>8} {'paged at':>9} {'warning':>8}  minutes firing"]
    failures, leads = [], []
    for s in shapes:
        times = sorted(fired[s.name])
        first = times[0] if times else None
        full = s.full_at
        paged = "never" if first is None else f"{first:g}"
        if s.leak:
            note = apart(s)
            young = bool(note)
            lead = None if first is None or full is None else full - first
            if lead is not None and lead > 0:
                leads.append(lead)
            note = f"  ({note})" if note else ""
            lines.append(
                f"{s.name:58} {full or '-':>8} {paged:>9} {'' if lead is None else f'{lead:.0f} min':>8}{note}"
            )
            if not young and (first is None or (full is not None and first >= full)):
                failures.append(f"{s.name}: full at {full}, paged at {first}")
            elif not young and s.guarantee and (lead is None or lead < s.guarantee):
                failures.append(f"{s.name}: {lead} min of warning, {s.guarantee:g} promised")
        else:
            lines.append(f"{s.name:58} {full or '-':>8} {paged:>9} {'':>8}  {len(times)}")
            if times:
                failures.append(f"{s.name}: healthy, paged at {times[:5]}...")
    return lines, failures, leads


def main(argv: list[str] | None = None) -> int:
    """Command line: print the table; 1 when a shape fails."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rules", type=Path, default=RULES)
    p.add_argument("--interval", type=int, default=60, help="seconds between samples (default 60)")
    p.add_argument("--only", default="", help="shapes whose name starts with this")
    p.add_argument("--random", type=int, default=0, help="this many random shapes instead of the fixed ones")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--write-promtool", type=Path, help="write the promtool cases of the fixed shapes there and stop")
    args = p.parse_args(argv)
    if args.write_promtool:
        write_promtool(args.write_promtool)
        return 0
    pool = randomized(args.random, args.seed) if args.random else leaks() + healthy()
    shapes = [s for s in pool if s.name.startswith(args.only)]
    fired = run(shapes, args.rules, args.interval)
    lines, failures, leads = report(shapes, fired)
    print("\n".join(lines))
    if leads:
        leads.sort()
        print(
            f"\nwarning before full, {len(leads)} leaks paged: min {leads[0]:.0f} min, median "
            f"{leads[len(leads) // 2]:.0f} min"
        )
    print(f"\n{len(failures)} failures" + "".join(f"\n  {f}" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
