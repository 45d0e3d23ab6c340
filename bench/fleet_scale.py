#!/usr/bin/env python3
"""What a fleet of N GPUs costs a real Prometheus with gpuwarden's rules, and how long ``top`` and ``report`` take
against it, for the tree and for a git revision side by side.

    python3 bench/fleet_scale.py [--gpus 512] [--hours 2] [--rev bc5f485 ...] [--seconds 120] [--families rules|all]
        [--compat] [--prometheus-cpu 1]

For each tree (the working tree, then each ``--rev`` checked out in a temporary worktree) it takes that tree's
exposition of a real H100 recording (tests/data/golden/h100-compute_bound.prom: 40 polls of a compute-bound job, as the
daemon of that tree exports it), repeats its GPU across ``--gpus`` GPUs on 8-GPU nodes (instance, gpu, uuid, pid and the
job made distinct: one Slurm job a node), writes ``--hours`` of it at 15 s scrapes ending now (gauges constant, counters
growing 15 s a scrape) as OpenMetrics, backfills it with ``promtool tsdb create-blocks-from openmetrics``, and runs
Prometheus over it with that tree's alerts/gpuwarden.rules.yml at a 15 s evaluation interval. It prints:

- the series a GPU the backfill holds, and the TSDB's bytes a GPU a day (block size on disk / GPUs / days);
- each rule group's evaluation time (``evaluationTime`` of /api/v1/rules, sampled every 2 s for ``--seconds``):
  median, 90th percentile and maximum, and the share of its interval, and each group's costliest rules. The memory
  group's window records (means, variances, least and most) are backfilled over the hours too, with ``promtool tsdb
  create-blocks-from rules``, so its detectors read the history a steady state has; memory in use is spread over
  40-95% across GPUs, a busy fleet;
- the wall time and exit of that tree's ``gpuwarden top`` with no flags (a day), ``--range 15m`` and ``--quality``,
  and ``gpuwarden report --job`` of a 64-GPU job over 15 minutes and a day and of an 8-GPU job over an hour, each
  within its own default timeout, the load beside each. The usage records are backfilled over the hours too (what
  ``top`` reads over 15 minutes or more). ``--compat`` loads the dcgm-exporter compatibility rules beside the rules;
  ``--prometheus-cpu`` pins Prometheus to CPUs of its own (``taskset``).

``--families rules`` (default) backfills only the families the rule file and the fleet commands read (the rest
changes no rule's cost, and leaves the backfill small); ``all`` backfills every family, for the bytes a GPU a day.
Needs prometheus and promtool on PATH. The values are constant, so the figures are what the rules and queries cost,
not what they find. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path("tests/data/golden/h100-compute_bound.prom")
RULES = Path("alerts/gpuwarden.rules.yml")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
SCRAPE = 15
#: Families the fleet commands read beyond the rules' (gpuwarden.cluster).
COMMANDS = (
    "gpu_job_info", "gpu_process_job_info", "gpu_idle_seconds_total", "gpu_state_seconds_total", "gpu_diagnosis",
    "gpu_up", "gpu_devices", "gpu_flop_utilization_ratio", "gpu_energy_joules_total",
    "gpu_held_idle_energy_joules_total", "gpu_peer_wait_seconds_total", "gpu_idle_energy_joules_total",
)  # fmt: skip


TOP_RULES = 6
#: The first 8 nodes' GPUs run one 64-GPU Slurm job (the rest one job a node).
JOB64 = "64000"
#: The dcgm-exporter compatibility rules, loaded beside the rules with ``--compat``.
COMPAT = Path("gpuwarden/mixin/dcgm-compat.rules.yml")
#: The recording's GPU's memory (an H100 80GB HBM3), from its gpu_memory_total_bytes.
TOTAL_BYTES = 85520809984.0


def _wanted(tree: Path, families: str) -> set[str] | None:
    """The metric names to backfill: those the tree's rules name and COMMANDS (None: every family)."""
    if families == "all":
        return None
    return set(re.findall(r"\b((?:gpu|gpuwarden)_[a-z_]+)", (tree / RULES).read_text())) | set(COMMANDS)


def _lines(tree: Path, gpus: int, wanted: set[str] | None) -> list[tuple[str, str, float]]:
    """(name, labels, value) of ``gpus`` copies of the tree's golden GPU on 8-GPU nodes, node-wide series once a
    node; masked (wall-clock) values left out, but the process's start time (3 hours ago)."""
    out: list[tuple[str, str, float]] = []
    for line in (tree / GOLDEN).read_text().splitlines():
        m = SAMPLE.match(line)
        if not m or (wanted is not None and m.group(1) not in wanted):
            continue
        if m.group(3) == "<masked>" and m.group(1) != "gpu_process_start_time_seconds":
            continue
        name, labels = m.group(1), (m.group(2) or "{}")[1:-1]
        # a process started 3 hours ago (past the memory rules' warm-up): the golden masks its re-stamped time
        value = time.time() - 3 * 3600 if m.group(3) == "<masked>" else float(m.group(3))
        per_gpu = 'uuid="' in labels
        for n in range(gpus if per_gpu else -(-gpus // 8)):
            if name == "gpu_memory_used_bytes":
                # jobs hold 40-95% of their GPU's memory (the recording's job held 1%, below the memory records'
                # idle bound: they and the detectors would see an idle fleet and cost less than a busy one)
                value = TOTAL_BYTES * (0.40 + 0.55 * (n % 11) / 10)
            node = n // 8 if per_gpu else n
            text = labels
            if per_gpu:
                text = re.sub(r'\bgpu="\d+"', f'gpu="{n % 8}"', text)
                text = re.sub(r'uuid="[^"]+"', f'uuid="GPU-{n:08d}"', text)
                text = re.sub(r'pid="\d+"', f'pid="{1000 + n}"', text)
                text = re.sub(r'job_id="[^"]*"', f'job_id="{JOB64 if node < 8 else 100000 + node}"', text)
                text = re.sub(r'job_kind="[^"]*"', 'job_kind="slurm"', text)
                text = re.sub(r'job_scope="[^"]*"', 'job_scope="cluster"', text)
            extra = f'instance="node-{node}:10400",job="gpuwarden"'
            out.append((name, f"{{{extra},{text}}}".replace(",}", "}"), value))
    return out


def _write(path: Path, lines: list[tuple[str, str, float]], end: int, hours: float) -> int:
    """Write ``hours`` of the lines at SCRAPE-second steps ending at ``end`` as OpenMetrics; return the sample count."""
    times = list(range(end - int(hours * 3600), end + 1, SCRAPE))
    n = 0
    with path.open("w") as f:
        for name, labels, value in lines:
            grows = name.endswith("_total") and value > 0
            f.writelines(f"{name}{labels} {value + SCRAPE * k if grows else value} {t}\n" for k, t in enumerate(times))
            n += len(times)
        f.write("# EOF\n")
    return n


def ready(url: str, seconds: float = 120) -> None:
    """Wait until the Prometheus at ``url`` says it is ready; RuntimeError after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("Prometheus did not come up")


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    """Wall seconds of ``cmd`` run in ``cwd`` (``python -m`` imports the package of its working directory first), or
    why it failed."""
    t = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=cwd)
    wall = time.monotonic() - t
    return f"{wall:6.1f} s" if done.returncode == 0 else f"{wall:6.1f} s, exit {done.returncode}: " + (
        done.stderr.strip().splitlines() or ["?"])[-1][:100]  # fmt: skip


def _serve(work: Path, port: int, rules: list[Path], cpu: str = "") -> subprocess.Popen[bytes]:
    """A Prometheus over ``work/tsdb`` on ``port``, evaluating ``rules`` every 15 s, on the CPUs ``cpu`` names
    (``taskset -c``; '' any)."""
    config = {"global": {"evaluation_interval": "15s"}, **({"rule_files": [str(r) for r in rules]} if rules else {})}
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    pinned = ["taskset", "-c", cpu] if cpu else []
    return subprocess.Popen([*pinned, shutil.which("prometheus") or "prometheus",
                             f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=30d", "--query.timeout=10m"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def _backfill_records(doc: dict, work: Path, end: int, hours: float) -> None:
    """Backfill the memory groups' window records (``uuid:gpu_memory_used_bytes:*``) and the usage records (what
    ``top`` reads over 15 minutes or more) over the hours, each at its group's interval, into ``work/tsdb``: a
    Prometheus with no rules answers promtool, in passes (a record that reads another waits for the pass after it:
    promtool evaluates each rule alone)."""
    groups = [g for g in doc["groups"] if g["name"].startswith("gpuwarden.memory") or g["name"] == "gpuwarden.usage"]
    interval = {r["record"]: g.get("interval", "1m") for g in groups for r in g["rules"] if "record" in r}
    prefix = "uuid:gpu_memory_used_bytes:"
    pending = [r for g in groups for r in g["rules"]
               if str(r.get("record", "")).startswith(prefix) or g["name"] == "gpuwarden.usage"]  # fmt: skip
    port = 19100 + os.getpid() % 400
    while pending:
        names = {r["record"] for r in pending}
        ready_now = [r for r in pending if not any(n in str(r["expr"]) for n in names - {r["record"]})]
        step = interval[ready_now[0]["record"]]
        now = [r for r in ready_now if interval[r["record"]] == step]  # one evaluation interval a pass
        pending = [r for r in pending if r not in now]
        (work / "records.yml").write_text(yaml.safe_dump({"groups": [{"name": "records", "rules": now}]}))
        proc = _serve(work, port, [])
        try:
            ready(f"http://127.0.0.1:{port}")
            subprocess.run([shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from", "rules",
                            f"--start={end - int(hours * 3600)}", f"--end={end}", f"--url=http://127.0.0.1:{port}",
                            f"--eval-interval={step}", f"--output-dir={work / 'records'}",
                            str(work / "records.yml")], check=True, capture_output=True)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
        for block in (work / "records").iterdir():
            shutil.move(str(block), work / "tsdb" / block.name)


def measure(tree: Path, label: str, args: argparse.Namespace, tmp: Path) -> None:
    """Backfill, evaluate and query one tree; print its figures."""
    promtool = shutil.which("promtool") or "promtool"
    work = tmp / label
    work.mkdir()
    lines = _lines(tree, args.gpus, _wanted(tree, args.families))
    per_gpu = sum(1 for _, labels, _ in lines if 'uuid="GPU-00000000"' in labels)
    end = int(time.time()) - 30
    t = time.monotonic()
    samples = _write(work / "in.om", lines, end, args.hours)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "in.om"), str(work / "tsdb")],
                   check=True, capture_output=True)  # fmt: skip
    (work / "in.om").unlink()
    size = sum(p.stat().st_size for p in (work / "tsdb").rglob("*") if p.is_file())
    print(f"\n== {label}: {args.gpus} GPUs x {args.hours:g} h, {per_gpu} series a GPU backfilled "
          f"({args.families}), {samples:,} samples in {time.monotonic() - t:.0f} s; TSDB "
          f"{size / args.gpus / (args.hours / 24) / 1e6:.2f} MB a GPU a day")  # fmt: skip
    doc = yaml.safe_load((tree / RULES).read_text())
    t = time.monotonic()
    _backfill_records(doc, work, end, args.hours)
    print(f"  the memory group's window records backfilled in {time.monotonic() - t:.0f} s")
    port = 19500 + os.getpid() % 400
    url = f"http://127.0.0.1:{port}"
    rule_files = [tree / RULES] + ([tree / COMPAT] if args.compat and (tree / COMPAT).exists() else [])
    for extra in rule_files[1:]:
        doc["groups"] += yaml.safe_load(extra.read_text())["groups"]
    print(f"  rule files: {', '.join(str(f.relative_to(tree)) for f in rule_files)}; Prometheus on CPU "
          f"{args.prometheus_cpu or 'any'}")  # fmt: skip
    proc = _serve(work, port, rule_files, args.prometheus_cpu)
    try:
        ready(url)
        time.sleep(20)
        seen: dict[str, list[float]] = {}
        rules: dict[tuple[str, str], list[float]] = {}
        stop = time.monotonic() + args.seconds
        while time.monotonic() < stop:
            for g in httpx.get(f"{url}/api/v1/rules", timeout=30).json()["data"]["groups"]:
                if g.get("evaluationTime"):
                    seen.setdefault(g["name"], []).append(float(g["evaluationTime"]))
                for i, r in enumerate(g.get("rules", [])):
                    if r.get("evaluationTime"):
                        rules.setdefault((g["name"], f"{r['name']}#{i}"), []).append(float(r["evaluationTime"]))
            time.sleep(2)
        intervals = {g["name"]: float(re.sub(r"[a-z]", "", str(g.get("interval", "15s")))) * (
            60 if str(g.get("interval", "")).endswith("m") else 1) for g in doc["groups"]}  # fmt: skip
        print(f"  rule group                      median      p90      max   of its interval (median); load "
              f"{os.getloadavg()[0]:.1f}")  # fmt: skip
        for group, values in sorted(seen.items()):
            q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
            share = statistics.median(values) / intervals.get(group, 15)
            print(f"  {group:28} {1000 * statistics.median(values):8.0f} ms {1000 * q[8]:6.0f} ms "
                  f"{1000 * max(values):6.0f} ms   {100 * share:5.1f}%")  # fmt: skip
        print(f"  the {TOP_RULES} costliest rules of each group (median ms; #n: its place in the group)")
        for group in sorted(seen):
            mine = {name: statistics.median(v) for (g, name), v in rules.items() if g == group}
            costly = sorted(mine.items(), key=lambda kv: -kv[1])[:TOP_RULES]
            print(f"    {group}: " + ", ".join(f"{name} {1000 * ms:.0f}" for name, ms in costly))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        gw = [sys.executable, "-m", "gpuwarden"]
        asked = ("--prometheus", url)  # each command's own timeout: what a user gets
        commands = {
            "top": ["top"],
            "top --range 15m": ["top", "--range", "15m"],
            "top --quality": ["top", "--quality"],
            "report (64 GPUs) --range 15m": ["report", "--job", JOB64, "--range", "15m"],
            "report (64 GPUs) --range 1d": ["report", "--job", JOB64, "--range", "1d"],
            "report (8 GPUs) --range 1h": ["report", "--job", "100010", "--range", "1h"],
        }
        for name, cmd in commands.items():
            print(f"  {name:30} {timed([*gw, *cmd, *asked], env, tree)}  (load {os.getloadavg()[0]:.1f})")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    """Measure the working tree, then ``--rev``; print both."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=512)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--rev", action="append", default=[], help="a git revision to measure beside the working tree "
                    "(repeatable)")  # fmt: skip
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--families", choices=("rules", "all"), default="rules")
    ap.add_argument("--compat", action="store_true", help="load the dcgm-exporter compatibility rules too")
    ap.add_argument("--prometheus-cpu", default="", help="the CPUs Prometheus runs on (taskset -c LIST)")
    args = ap.parse_args()
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        print("fleet_scale: prometheus and promtool must be on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        measure(REPO, "working tree", args, tmp)
        for rev in args.rev:
            other = tmp / f"rev-{rev}"
            subprocess.run(["git", "worktree", "add", "--detach", str(other), rev], cwd=REPO, check=True,
                           capture_output=True)  # fmt: skip
            try:
                measure(other, rev, args, tmp)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=REPO, capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
