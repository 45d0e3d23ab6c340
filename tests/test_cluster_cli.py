"""``gpuwarden top`` and ``gpuwarden report`` against a real Prometheus scraping four replayed nodes: two run one
4-rank Slurm job whose cgroups carry its SLUID, as Slurm 26.05 names them (derived traces,
tests/data/make_cluster_traces.py, marked ``modified``; only node a's daemon could read the numeric id 4242), the
third a held-idle H100 (a real recording) whose job id is node-local, the fourth two Slurm jobs in turn. Every node
prices its GPU-hours."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, prometheus, replay_nodes, stop_all, wait_http

TRACES = REPO / "tests" / "data" / "traces"
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (CI installs Debian's package)"),
    pytest.mark.xdist_group("cluster_cli"),  # one worker builds the module's stack, not each (--dist loadgroup)
]

NODES = {"a": "derived-h200x2-slurm-4242-a", "b": "derived-h200x2-slurm-4242-b", "c": "h100-held_idle",
         "d": "h100-jobs-in-turn"}  # fmt: skip
PRICE = {"a": "4", "b": "4", "c": "2", "d": "2.5"}
SLUID = "sEKNKTV3WPV500"  # Slurm job 4242's


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("cluster")
    env = {n: {"GPUWARDEN_NODE_NAME": f"node-{n}", "GPUWARDEN_PRICE_PER_GPU_HOUR": PRICE[n]} for n in NODES}
    procs, ports = replay_nodes(NODES, env, ("--collector.idle_energy",))  # report's energy wasted by cause
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "gpuwarden",
                            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}]}],
    }  # fmt: skip
    server, url = prometheus(PROMETHEUS, tmp, config)
    procs.append(server)
    try:
        for p in ports.values():
            wait_http(f"http://127.0.0.1:{p}/healthz")
        wait_http(f"{url}/-/ready")
        time.sleep(60)  # one-second scrapes: node d's second job starts 49 s into its recording
        yield {"url": url, "ports": ports}
    finally:
        stop_all(procs)


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwarden", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, check=False, env={**os.environ, "COLUMNS": "160"})  # fmt: skip


@pytest.mark.e2e
def test_top_ranks_the_jobs_across_nodes_with_causes_verdicts_and_cost(prom: dict) -> None:
    res = gw("top", "--prometheus", prom["url"], "--range", "30s", "--step", "1s", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    slurm = jobs[SLUID]
    # one job on two nodes under its SLUID, not two: 4 GPUs, both instances
    assert slurm["instance"] is None and slurm["job_kind"] == "slurm"
    assert len(slurm["gpus"]) == 4 and len(slurm["instances"]) == 2
    assert slurm["held_gpu_hours"] == pytest.approx(4 * 30 / 3600, rel=0.25)
    assert 0 < slurm["lost_gpu_hours"] < slurm["held_gpu_hours"]
    assert sum(slurm["lost_gpu_hours_by_cause"].values()) == pytest.approx(slurm["lost_gpu_hours"])
    assert slurm["cost"] == pytest.approx(slurm["lost_gpu_hours"] * 4) and slurm["currency"] == "USD"
    assert {"waiting_on_peers", "input_starved"} & set(slurm["verdict"]) and slurm["first_remedy"]
    # effective and peak-equivalent (OFU) GPU-hours and the time spent waiting on peers, in top as in report
    assert 0 < slurm["peak_equivalent_gpu_hours"] <= slurm["busy_gpu_hours"] * 1.05
    assert 0 <= slurm["effective_gpu_hours"] <= slurm["held_gpu_hours"]
    assert 0 < slurm["peer_wait_gpu_hours"] < slurm["busy_gpu_hours"]
    # the held-idle H100's job is node-local: keyed by its instance, lost to held_idle, priced at its node's price
    [idle] = [j for j in doc["jobs"] if j["instance"] == f"127.0.0.1:{prom['ports']['c']}"]
    assert idle["instance"] == f"127.0.0.1:{prom['ports']['c']}"
    causes = idle["lost_gpu_hours_by_cause"]
    assert max(causes, key=causes.get) == "held_idle" and idle["verdict"][0] == "held_idle"
    assert idle["cost"] == pytest.approx(idle["lost_gpu_hours"] * 2)
    # ranked by lost GPU-hours; every GPU of the three nodes in the GPU table
    lost = [j["lost_gpu_hours"] for j in doc["jobs"]]
    assert lost == sorted(lost, reverse=True)
    assert len(doc["gpus"]) == 6 and {g["node"] for g in doc["gpus"]} == {"node-a", "node-b", "node-c", "node-d"}


@pytest.mark.e2e
def test_top_prints_tables_a_person_reads(prom: dict) -> None:
    res = gw("top", "--prometheus", prom["url"], "--range", "30s", "--step", "1s")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "Jobs by GPU-hours lost, last 30s" in out and "GPUs by GPU-hours lost" in out
    assert SLUID in out and "node-a, node-b" in out and "held_idle" in out and "USD" in out
    assert len(out.splitlines()) < 40
    # not a terminal: tab-separated, every column, a job a line, the same cells in every row
    lines = out.splitlines()
    header = lines[lines.index("# Jobs by GPU-hours lost, last 30s") + 1].split("\t")
    assert header[:3] == ["job", "GPUs", "held h"] and "node" in header and "cost" in header
    [row] = [r for r in (x.split("\t") for x in lines) if r[0] == SLUID]
    assert len(row) == len(header) and row[header.index("node")] == "node-a, node-b"
    assert row[header.index("cost")].endswith("USD") and "%)" in row[header.index("lost h")]
    assert max(len(x) for x in lines) < 400 and not any(x != x.rstrip() for x in lines)
    # docs/cluster.md quotes this output: its header, and a row for each job it shows, as the command prints them
    doc = (REPO / "docs" / "cluster.md").read_text()
    quoted = doc[doc.index("# Jobs by GPU-hours lost, last 30s") :].split("```")[0].splitlines()
    assert quoted[1].split("\t") == header
    printed = {r[0]: r for r in (x.split("\t") for x in lines)}
    for shown in (q.split("\t") for q in quoted[2:] if q):
        assert shown[0] in printed and len(shown) == len(header), shown[0]
        assert shown[header.index("node")] == printed[shown[0]][header.index("node")]
        assert shown[header.index("lost to")] == printed[shown[0]][header.index("lost to")]
    details = gw("top", "--prometheus", prom["url"], "--range", "30s", "--step", "1s", "--details")
    assert details.returncode == 0 and "do first:" in details.stdout and "nodes: node-a, node-b" in details.stdout


@pytest.mark.e2e
def test_jobs_holding_one_gpu_in_turn_each_get_their_own_time_and_verdict(prom: dict) -> None:
    """Node d is a live H100 recording: Slurm job 901 (input-starved, ids from SLURM_JOB_ID) held GPU 0 from 3 s to
    44 s, then job 902 held 20 GiB with nothing running from 49 s on (tools/device-cluster-live.sh)."""
    res = gw("top", "--prometheus", prom["url"], "--range", "70s", "--step", "1s", "--json")
    assert res.returncode == 0, res.stderr
    jobs = {j["job_id"]: j for j in json.loads(res.stdout)["jobs"]}
    first, second = jobs["901"], jobs["902"]
    assert first["job_kind"] == second["job_kind"] == "slurm"
    assert first["verdict"][0] == "input_starved" and "held_idle" not in first["verdict"]
    assert second["verdict"][0] == "held_idle"
    causes = first["lost_gpu_hours_by_cause"]
    assert max(causes, key=causes.get) == "input_cpu" and first["lost_gpu_hours_by_cause"]["held_idle"] == 0
    assert second["lost_gpu_hours_by_cause"]["held_idle"] > second["lost_gpu_hours_by_cause"]["input_cpu"]
    assert first["held_gpu_hours"] + second["held_gpu_hours"] <= 70 / 3600 * 1.05  # never two jobs at once
    rep = gw("report", "--job", "902", "--prometheus", prom["url"], "--range", "70s", "--step", "1s", "--json")
    doc = json.loads(rep.stdout)
    assert doc["held_idle_energy_joules"] is not None and doc["held_idle_energy_joules"] >= 0
    assert "end the idle process" in doc["first_remedy"]
    # the power each cause of idle time cost: the held-idle job's is its held-idle energy, the starved job's goes
    # mostly to waiting on its input
    energy = doc["idle_energy_joules_by_cause"]
    assert energy["held_idle"] == pytest.approx(doc["held_idle_energy_joules"], abs=1e-6)
    rep = gw("report", "--job", "901", "--prometheus", prom["url"], "--range", "70s", "--step", "1s", "--json")
    energy = json.loads(rep.stdout)["idle_energy_joules_by_cause"]
    assert max(energy, key=energy.get) == "input_cpu" and energy["input_cpu"] > 0, energy


@pytest.mark.e2e
@pytest.mark.parametrize("step", ["1s", "5s", "15s", "30s"])
def test_lost_gpu_hours_are_the_counters_growth_whatever_the_step(prom: dict, step: str) -> None:
    """Node c's GPU is held idle by one job the whole time: at any step, the job's held and lost GPU-hours are the
    GPU's, and the GPU's are its counters' growth over exactly the range (the same numbers at every step)."""
    from gpuwarden.cluster.promapi import Prometheus
    from gpuwarden.cluster.usage import Accounting

    instance = f"127.0.0.1:{prom['ports']['c']}"
    client = Prometheus(prom["url"], timeout=30)
    try:
        at = time.time() - 0.4  # not on a multiple of any step: the range still ends there
        acc = Accounting(client, "30s", step, at=at)
        jobs, gpus = acc.jobs(), acc.gpus()
        idle = sum(s.value for s in client.query(f'gpu_idle_seconds_total{{instance="{instance}"}}', at))
        before = sum(s.value for s in client.query(f'gpu_idle_seconds_total{{instance="{instance}"}} offset 30s', at))
    finally:
        client.close()
    [(key, job)] = [(k, u) for k, u in jobs.items() if k.instance == instance]
    [gpu] = [u for (_, i, _), u in gpus.items() if i == instance]
    assert job.lost_total == pytest.approx(gpu.lost_total, abs=1e-9)
    assert job.held_hours == pytest.approx(job.lost_total + job.busy_hours, abs=1e-9)
    assert job.lost_hours["held_idle"] == pytest.approx(job.lost_total, abs=1e-9)
    assert gpu.held_hours == pytest.approx(job.held_hours, abs=1e-9)
    assert gpu.lost_total + gpu.free_hours == pytest.approx((idle - before) / 3600, abs=1e-9)
    assert abs(job.held_hours - 30 / 3600) <= 1.5 / 3600  # one scrape interval (1 s) and some jitter


@pytest.mark.e2e
def test_report_summarizes_one_job(prom: dict) -> None:
    """Asked for by the numeric id users know, the SLUID-keyed job is found (through node a's ``slurm_job_id``) and
    reported whole: both nodes' GPUs, node b's too although its daemon could not read the number."""
    res = gw("report", "--job", "4242", "--prometheus", prom["url"], "--range", "30s", "--step", "1s", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["job_id"] == SLUID and doc["asked_for"] == "4242"
    assert {g["instance"] for g in doc["gpus"]} == {f"127.0.0.1:{prom['ports'][n]}" for n in "ab"}
    assert doc["job_kind"] == "slurm" and len(doc["gpus"]) == 4
    assert 0 <= doc["effective_gpu_hours"] <= doc["held_gpu_hours"]
    # the DDP recording's bf16 work on H200s (GPM): tensor work at peak takes less than the time a kernel ran
    assert 0 < doc["peak_equivalent_gpu_hours"] <= doc["busy_gpu_hours"] * 1.05
    assert doc["busy_gpu_hours"] + doc["lost_gpu_hours"] <= doc["held_gpu_hours"] * 1.1
    assert doc["energy_joules"] is None or doc["energy_joules"] >= 0
    assert doc["first_remedy"]
    # rank 0 spins in the all-reduce while rank 1 works on the CPU: busy by NVML, waiting on its peer, drawing power
    assert 0 < doc["peer_wait_gpu_hours"] < doc["busy_gpu_hours"]
    assert doc["peer_wait_energy_joules"] > 0
    text = gw("report", "--job", "4242", "--prometheus", prom["url"], "--range", "30s", "--step", "1s")
    assert text.returncode == 0 and "GPU-hours held" in text.stdout and "Do first" in text.stdout
    assert "waiting on peers" in text.stdout and "drawn while waiting on peers" in text.stdout


@pytest.mark.e2e
def test_a_jobs_report_asks_only_about_its_gpus_and_equals_the_fleets_accounting(prom: dict) -> None:
    """After one lookup of the GPUs the job held, every query of a report names those GPUs' UUIDs (a job's report
    costs what the job is, not what the fleet is) but the nodes' prices (a sample a node, no UUID), and it gives
    the job what the fleet-wide accounting gives it, its cost included."""
    from gpuwarden.cluster.promapi import Prometheus
    from gpuwarden.cluster.usage import Accounting

    client = Prometheus(prom["url"], timeout=30)
    asked: list[str] = []
    query = client.query

    def recorded(promql: str, at: float | None = None) -> list:
        asked.append(promql)
        return query(promql, at)

    client.query = recorded  # type: ignore[method-assign,assignment]
    try:
        at = time.time()
        narrow = Accounting(client, "30s", "1s", at=at).job_details(SLUID)
        lookups, rest = asked[:1], [q for q in asked[1:] if "gpuwarden_gpu_hour_price" not in q]
        asked.clear()
        whole = Accounting(client, "30s", "1s", at=at).jobs()
    finally:
        client.close()
    [(key, u)] = narrow.items()
    assert "gpu_job_info" in lookups[0] and "uuid=~" not in lookups[0]
    uuids = {x for q in rest for x in q.split('uuid=~"')[1].split('"')[0].split("|")}
    assert rest and all('uuid=~"' in q for q in rest)
    assert len(uuids) == len(u.gpus) == 4  # the job's four GPUs on nodes a and b, not node c's or d's
    assert all("uuid=~" not in q for q in asked)  # the fleet-wide accounting is not narrowed
    assert u.gpus == whole[key].gpus and u.held_hours == pytest.approx(whole[key].held_hours, rel=1e-9)
    assert u.busy_hours == pytest.approx(whole[key].busy_hours, rel=1e-9)
    assert u.lost_hours == pytest.approx(whole[key].lost_hours, rel=1e-9, abs=1e-12)
    assert u.reasons == whole[key].reasons
    assert u.cost is not None and u.cost == pytest.approx(whole[key].cost, rel=1e-9)


@pytest.mark.e2e
def test_the_slurm_epilog_writes_one_record_per_job(prom: dict, tmp_path: Path) -> None:
    """deploy/slurm/epilog.sh as slurmd runs it (the job's environment, no scontrol on this machine): it asks for the
    SLUID first (the job's cgroups carry it) and leaves one JSON record, named by the numeric id, of the job, its 4
    GPUs and when it was taken."""
    wrapper = tmp_path / "gpuwarden"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuwarden "$@"\n')
    wrapper.chmod(0o755)
    records = tmp_path / "records"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_SLUID": "sEKNKTV3WPV500", "SLURM_JOB_START_TIME": str(int(time.time()) - 30),
           "SLURMD_NODENAME": "node-a", "GPUWARDEN": str(wrapper), "GPUWARDEN_PROMETHEUS": prom["url"],
           "GPUWARDEN_JOB_RECORDS": str(records), "GPUWARDEN_REPORT_ARGS": "--step 1s"}  # fmt: skip
    res = subprocess.run(["sh", str(REPO / "deploy" / "slurm" / "epilog.sh")], env=env, capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert res.returncode == 0 and res.stdout == "", res.stderr
    assert sorted(p.name for p in records.iterdir()) == ["4242.json"]
    doc = json.loads((records / "4242.json").read_text())
    assert doc["job_id"] == doc["asked_for"] == SLUID and doc["job_kind"] == "slurm" and len(doc["gpus"]) == 4
    assert doc["range"] == "2m" and abs(doc["evaluated_at"] - time.time()) < 120 and doc["held_gpu_hours"] > 0


@pytest.mark.e2e
def test_report_of_an_unknown_job_is_one_line_and_exit_1(prom: dict) -> None:
    res = gw("report", "--job", "nope", "--prometheus", prom["url"], "--range", "30s", "--step", "1s")
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().count("\n") == 0 and "no job 'nope'" in res.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prometheus", "http://127.0.0.1:1"], "cannot reach"),
        (["--prometheus", "http://127.0.0.1:{c}"], "not the Prometheus API"),
    ],
)
@pytest.mark.e2e
def test_top_against_something_that_is_not_prometheus_is_one_line(prom: dict, args: list[str], message: str) -> None:
    args = [a.format(c=prom["ports"]["c"]) for a in args]
    res = gw("top", *args)
    assert res.returncode == 1 and message in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr


def test_the_cluster_traces_are_what_their_script_writes_and_say_they_are_modified(tmp_path: Path) -> None:
    import importlib.util

    from gpuwarden.trace import read_trace

    spec = importlib.util.spec_from_file_location("make", REPO / "tests" / "data" / "make_cluster_traces.py")
    assert spec and spec.loader
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    make.TRACES = tmp_path  # type: ignore[attr-defined]
    for node in ("a", "b"):
        fresh = read_trace(make.write(node))
        committed = read_trace(TRACES / f"derived-h200x2-slurm-4242-{node}.jsonl.gz")
        assert "Slurm job 4242" in committed[0].metadata["modified"]
        assert fresh[0].model_dump(exclude={"created"}) == committed[0].model_dump(exclude={"created"})
        assert [p.model_dump() for p in fresh[1]] == [p.model_dump() for p in committed[1]]


@pytest.mark.e2e
def test_the_job_dashboard_finds_a_slurm_job_by_its_number(prom: dict) -> None:
    """The job view's "Slurm job" box narrows its job ids to the job whose series carry that ``slurm_job_id``: 4242
    finds its SLUID (only node a's daemon could read the number); the box's default lists every id."""
    import httpx

    board = json.loads((REPO / "gpuwarden" / "mixin" / "dashboards" / "gpuwarden-job.json").read_text())
    [job_id] = [v for v in board["templating"]["list"] if v["name"] == "job_id"]
    query = job_id["query"]["query"] if isinstance(job_id["query"], dict) else job_id["query"]
    selector = query.removeprefix("label_values(").rsplit(",", 1)[0]

    def ids(slurm_job: str) -> set[str]:
        expr = selector.replace("$cluster", ".*").replace("$job", ".*").replace("$slurm_job_id", slurm_job)
        # label_values over the dashboard's time range: the series of the last 5 minutes
        q = f"group by (job_id) (last_over_time({expr}[5m]))"
        body = httpx.get(f"{prom['url']}/api/v1/query", params={"query": q}).json()
        return {r["metric"]["job_id"] for r in body["data"]["result"]}

    assert ids("4242") == {SLUID}
    assert {SLUID, "901", "902"} <= ids(".*")


def test_suspects_become_an_exclude_list_with_hostile_node_names_left_out() -> None:
    from gpuwarden.cluster.exclude import exclude_list, from_suspects
    from gpuwarden.cluster.suspects import Suspect

    found = from_suspects(
        [
            (Suspect("10.0.0.1:10400", "1", "GPU-a", 4, ["HBM 7 °C hotter"]), "gpu-node-07"),
            (Suspect("10.0.0.1:10400", "3", "GPU-b", 3), "gpu-node-07"),
            (Suspect("10.0.0.2:10400", "0", "GPU-c", 3), "node-08; rm -rf /"),
            (Suspect("10.0.0.3:10400", "2", "GPU-d", 5), "Node_09"),
        ]
    )
    slurm = exclude_list(found, "slurm", "7d")
    assert 'scontrol update NodeName=gpu-node-07,Node_09 State=DRAIN Reason="gpuwarden fail-slow suspect"' in slurm
    assert "sbatch --exclude=gpu-node-07,Node_09" in slurm
    assert "# gpu-node-07: GPU 1 the straggler of 4 jobs (HBM 7 °C hotter); GPU 3 the straggler of 3 jobs" in slurm
    assert "# left out: 'node-08; rm -rf /' is not a valid slurm node name" in slurm
    assert all(line.startswith("#") or "rm -rf" not in line for line in slurm.splitlines())
    k8s = exclude_list(found, "k8s", "7d")
    assert "kubectl taint nodes gpu-node-07 gpuwarden.io/fail-slow=gpu1_3:NoSchedule --overwrite" in k8s
    assert "Node_09" not in k8s.replace("# left out: 'Node_09'", "")  # not an RFC 1123 name
    assert exclude_list([], "slurm", "1d").endswith("# no node to exclude\n")


def test_format_without_suspects_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwarden.cli import build_parser

    args = build_parser("top").parse_args(["top", "--prometheus", "http://127.0.0.1:9", "--format", "slurm"])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "give one of them" in err and err.count("\n") == 1
