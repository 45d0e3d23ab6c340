"""End to end: a real Prometheus scrapes gpuwarden daemons replaying recorded traces (real ones, and derived ones
marked ``modified`` in their headers: tests/data/make_*.py) with the shipped rules loaded, and a real Alertmanager
with the shipped routes and inhibitions (gpuwarden/mixin/alertmanager.yml) delivers to a webhook, one path per
receiver. Every dashboard query and recording rule answers; the on-call alerts arrive where they should, once.

The rules are generated with shorter ranges (alerts/generate.py parameters) and every ``for:`` cut to 5 s, group
intervals dropped (evaluation every second), so the alerts fire within the test's time; expressions, labels and
annotations are otherwise the shipped ones. Alertmanager's group_wait is cut to 2 s (8 s for the chat route).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import free_port, prometheus, stop_all, wait_http

REPO = Path(__file__).parent.parent
TRACES = REPO / "tests" / "data" / "traces"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.xdist_group("e2e_prometheus"),  # one worker builds the module's stack, not each (--dist loadgroup)
    pytest.mark.skipif(
        PROMETHEUS is None or ALERTMANAGER is None,
        reason="prometheus / prometheus-alertmanager not installed (CI installs Debian's packages)",
    ),
]


class Webhook(BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []  # (receiver path, notification)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Webhook.received.append((self.path.strip("/"), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


#: Every node's cluster (a target label, as a fleet with several clusters sets it).
CLUSTER = "e2e"
#: scenario -> trace replayed (each daemon's node name is its scenario).
NODES = {
    "ddp": "h200x2-ddp_straggler",
    "hot": "derived-h100-hot-full",
    "mem95": "derived-h100-memory-95",
    "leak": "derived-h100-memory-leak",
    "warmup": "derived-h100-memory-warmup",
    "twojobs": "derived-h100-memory-two-jobs",
    "idle": "h100-held_idle",
    "lost": "derived-8gpu-lost",
    "ecc": "derived-h100-health",
    "eight": "derived-8gpu",
}
#: Shorter windows than production, so the rules see enough data within the test: the memory page's minutes are
#: seconds here (its traces are one poll a second for one sample a minute: tools/memory_shapes.py's time scale).
PARAMS = {"memory_interval": "1s", "memory_warmup": "30s", "memory_trend_windows": "5s, 10s",
          "memory_long_trend_windows": "20s, 30s", "memory_long_interval": "2s", "memory_grower_window": "10s",
          "memory_grower_history": "60s",
          "memory_trend_horizon_seconds": 60,
          "memory_ramp_window": "1s", "memory_ramp_horizon_seconds": 15, "held_idle_range": "20s",
          "straggler_for": "10s", "suspect_range": "5m", "grafana_url": "https://grafana.example"}  # fmt: skip


def _daemon(trace: str, port: int, node: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "serve", "--replay", str(TRACES / f"{trace}.jsonl.gz"),
         "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warning"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "GPUWARDEN_NODE_NAME": node, "GPUWARDEN_PRICE_PER_GPU_HOUR": "3.5"},
    )  # fmt: skip


def _targets(path: Path, ports: dict[str, int]) -> None:
    groups = [{"targets": [f"127.0.0.1:{port}"], "labels": {"scenario": name, "cluster": CLUSTER}}
              for name, port in ports.items()]  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)  # atomic: Prometheus never reads half a file


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("e2e")
    procs: list[subprocess.Popen] = []
    hook = HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    ports = {name: free_port() for name in NODES}
    am_port = free_port()
    try:
        daemons = {name: _daemon(trace, ports[name], name) for name, trace in NODES.items()}
        procs += daemons.values()
        (tmp / "params.yml").write_text(yaml.safe_dump(PARAMS))
        gen = subprocess.run(
            [sys.executable, str(REPO / "alerts" / "generate.py"), "--params", str(tmp / "params.yml"),
             "--out", str(tmp / "generated.yml")], capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr
        rules = yaml.safe_load((tmp / "generated.yml").read_text())
        for group in rules["groups"]:
            group.pop("interval", None)
            for rule in group["rules"]:
                if "for" in rule:  # the memory page's 2 minutes are 2 seconds, as its windows are
                    rule["for"] = "2s" if rule.get("alert") == "GpuMemoryFillingUp" else "5s"
        (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
        am = yaml.safe_load((REPO / "gpuwarden" / "mixin" / "alertmanager.yml").read_text())
        am["route"]["group_wait"] = "2s"
        for route in am["route"]["routes"]:
            if "group_wait" in route:  # the chat route's (2m): long enough that every GPU's alert joins the group
                route["group_wait"] = "8s"
        for r in am["receivers"]:
            r["webhook_configs"] = [{"url": f"http://127.0.0.1:{hook.server_port}/{r['name']}", "send_resolved": False}]
        (tmp / "am.yml").write_text(yaml.safe_dump(am))
        _targets(tmp / "targets.json", ports)
        procs.append(subprocess.Popen(
            [ALERTMANAGER, f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'am'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        server, prom = prometheus(PROMETHEUS, tmp, {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "gpuwarden",
                                "file_sd_configs": [{"files": [str(tmp / "targets.json")], "refresh_interval": "1s"}]}],
        })  # fmt: skip
        procs.append(server)
        for name, port in ports.items():  # a daemon that could not listen exits: said at once, not as a missing alert
            wait_http(f"http://127.0.0.1:{port}/healthz", proc=daemons[name])
        wait_http(f"http://127.0.0.1:{am_port}/-/ready")
        # 20 scrapes of every node and 20 rule evaluations, so rates and for: have their samples
        scraped = f'count(count_over_time(up{{job="gpuwarden"}}[1m]) >= 20) == {len(ports)}'
        evaluated = "max(count_over_time(uuid:gpu_memory_used_bytes:min_interval[1m])) >= 20"
        _wait_until(prom, f"({scraped}) and on () {evaluated}")
        # the node "eight" restarts under another instance with fewer GPUs (the 2-GPU trace), same node name
        old = daemons["eight"]
        old.terminate()
        old.wait(10)
        ports["eight"] = free_port()
        procs.append(_daemon(NODES["ddp"], ports["eight"], "eight"))
        wait_http(f"http://127.0.0.1:{ports['eight']}/healthz")
        _targets(tmp / "targets.json", ports)
        _wait_until(prom, f'count_over_time(up{{instance="127.0.0.1:{ports["eight"]}"}}[1m]) >= 15')
        PORTS.update(ports)
        yield {"prom": prom, "ddp": f"127.0.0.1:{ports['ddp']}", "ports": ports, "rules": rules}
    finally:
        stop_all(procs)
        hook.shutdown()


def query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def dashboard_panels() -> list[tuple[str, str, list[str]]]:
    """(dashboard, panel title, the panel's query expressions) of every panel of gpuwarden/mixin/dashboards/*.json."""
    out = []
    for path in sorted((REPO / "gpuwarden" / "mixin" / "dashboards").glob("*.json")):
        for p in json.loads(path.read_text())["panels"]:
            out.append((path.stem, p["title"], [t["expr"] for t in p["targets"]]))
    return out


def promql_regex(value: str) -> str:
    """A value regex-escaped inside a PromQL string, as Grafana inserts an "All"/multi-value variable."""
    return re.escape(value).replace("\\", "\\\\")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable substitution for the variables of gpuwarden/mixin/dashboards/*.json."""
    expr = expr.replace("$__rate_interval", "10s").replace("$__range", "1m")
    values = {"cluster": ".*", "slurm_job_id": ".*", **values}  # "All" clusters; no Slurm job number typed
    return re.sub(r"\$(job_id|job|instance|gpu|cluster|slurm_job_id)\b", lambda m: values[m.group(1)], expr)


def _label_values(prom: str, label: str, selector: str) -> list[str]:
    return sorted({r["metric"][label] for r in query(prom, f"group by ({label}) ({selector})")})


def test_every_dashboard_panel_shows_data_for_every_variable_value(stack: dict) -> None:
    """Each panel returns data (no bare "No data") for every node, every GPU of it - the lost GPU 3 of the "lost"
    node included - and every job id, as Grafana would substitute them; and each query returns data for some value.

    A panel may draw some series only when they are non-zero or active (XIDs, clock event reasons, a lost GPU's
    marker) next to a query that always answers; those queries must answer for at least one value here.
    """
    prom = stack["prom"]
    combos = [{"job": ".*", "instance": ".*", "gpu": ".*", "job_id": "x"}]
    for instance in _label_values(prom, "instance", "gpu_up"):
        combos.append({"job": "gpuwarden", "instance": instance, "gpu": ".*", "job_id": "x"})
        for gpu in _label_values(prom, "gpu", f'gpu_up{{instance="{instance}"}}'):
            combos.append({"job": "gpuwarden", "instance": instance, "gpu": gpu, "job_id": "x"})
    for job_id in _label_values(prom, "job_id", "gpu_process_job_info"):
        quoted = json.dumps(job_id)[1:-1]
        combos.append({"job": ".*", "instance": ".*", "gpu": ".*", "job_id": quoted})
        # the job view's node: a node-local id is that node's job only
        for instance in _label_values(prom, "instance", f'gpu_process_job_info{{job_id="{quoted}"}}'):
            combos.append({"job": ".*", "instance": instance, "gpu": ".*", "job_id": quoted})
    lost = f"127.0.0.1:{stack['ports']['lost']}"
    assert {"job": "gpuwarden", "instance": lost, "gpu": "3", "job_id": "x"} in combos
    # (over 15 s: the looping replay reads GPU 3 up for 2 polls of every 30)
    assert query(prom, f'min_over_time(gpu_up{{instance="{lost}", gpu="3"}}[15s]) == 0'), "GPU 3 is not lost"
    cases = []
    for board, title, exprs in dashboard_panels():
        uses = set(re.findall(r"\$(job_id|instance|gpu)\b", " ".join(exprs)))
        relevant = [c for c in combos if ("job_id" in uses) == (c["job_id"] != "x")]
        if "gpu" not in uses:
            relevant = [c for c in relevant if c["gpu"] == ".*"]
        if any('instance="$instance"' in e for e in exprs):  # a single-value variable: no "All"
            relevant = [c for c in relevant if c["instance"] != ".*"]
        cases += [(board, title, exprs, values) for values in relevant]

    def shows(case: tuple[str, str, list[str], dict[str, str]]) -> set[str]:
        """The panel's queries that answer for these values ({}: none, the panel shows "No data")."""
        *_, exprs, values = case
        for _attempt in range(2):  # a replay that loops starts its GPM ratios again: absent for one poll
            found = {e for e in exprs if query(prom, substitute(e, values))}
            if found:
                return found
            time.sleep(2)
        return set()

    with ThreadPoolExecutor(max_workers=6) as pool:  # as Grafana asks: a dashboard's panels at once
        results = list(pool.map(shows, cases))
    answered: set[str] = set().union(*results)
    blank = [(b, t, v["instance"], v["gpu"], v["job_id"]) for (b, t, _, v), r in zip(cases, results, strict=True)
             if not r]  # fmt: skip
    assert blank == [], "\n".join(map(str, blank))
    # events (XIDs, ECC and NVLink errors "> 0" in the last interval) and fallbacks for GPUs without GPM ("unless")
    # need not happen in these traces; every other query must answer for some value
    dead = [
        e
        for _, _, exprs in dashboard_panels()
        for e in exprs
        if e not in answered and not re.search(r"\) > 0$| unless ", e)
    ]
    assert dead == [], "\n".join(dead)


def test_every_dashboard_variable_has_values(stack: dict) -> None:
    [ddp_job] = _label_values(stack["prom"], "job_id", f'gpu_process_job_info{{instance="{stack["ddp"]}"}}')
    plain = {"job": "gpuwarden", "instance": stack["ddp"], "job_id": ddp_job, "cluster": CLUSTER}
    typed = {"slurm_job_id": ".*"}  # a text box: its default, inserted as typed (a single value is not escaped)

    def fill(m: re.Match) -> str:  # =~ takes the regex-escaped value, = the value itself (as Grafana inserts them)
        if m.group(2) in typed:
            return f'{m.group(1)}"{typed[m.group(2)]}"'
        value = plain[m.group(2)]
        return f'{m.group(1)}"{promql_regex(value) if m.group(1) == "=~" else value}"'

    for path in sorted((REPO / "gpuwarden" / "mixin" / "dashboards").glob("*.json")):
        for v in json.loads(path.read_text())["templating"]["list"]:
            if v["type"] != "query":
                continue
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", q)
            assert m, q
            selector = re.sub(r'(=~|=)"\$(job_id|job|instance|cluster|slurm_job_id)"', fill, m.group(1))
            r = httpx.get(f"{stack['prom']}/api/v1/label/{m.group(2)}/values", params={"match[]": selector}, timeout=10)
            assert r.json()["data"], (path.stem, v["name"], selector)


#: Cross-node rules see only ids that are the same job on every node (job_scope="cluster"); every replayed trace's
#: job is a cgroup id, node-local - and "lost" and "eight" share one, on two unrelated nodes - but the two Slurm jobs
#: of "twojobs".
CROSS_NODE = {"job_id:gpu_nodes:count", "job_id:gpu_imbalance_ratio:across_nodes"}
PORTS: dict[str, int] = {}


#: Records that hold a series only while their condition does (a leak: the leak test asks for it; a job in its
#: start-up phase; an application XID of the last 15 minutes; a GPU whose clocks were held down for half of 10
#: minutes: these recordings have none), or only for what this
#: stack's recordings and targets lack: GPUs with NVLink links, an NVLink fabric domain (the recorded NVLink GPUs have
#: none: an all-zero cluster UUID), the rack and row target labels, and the energy held idle (the opt-in idle_energy
#: collector, which these daemons do not run); promtool's cases (alerts/tests) give each of them data.
CONDITIONAL = {"uuid:gpu_memory_used_ratio:leaking", "uuid:gpu_memory_used_bytes:leaking_long",
               "uuid:gpu_startup_phase:interval",
               "uuid:gpu_application_xid:recent", "job_id:gpu_application_xid:count",
               "uuid:gpu_clock_throttled:ratio", "job_id:gpu_clock_throttled:count",
               "nvlink_domain:gpus:count", "nvlink_domain:gpu_fabric_unhealthy:count",
               "nvlink_domain:gpu_fabric_not_ready:count",
               "rack:gpus:count", "rack:gpu_hot:count", "row:gpus:count", "row:gpu_hot:count",
               "uuid:gpu_nvlink_links_up:count", "uuid:gpu_nvlink_links_up:max1d",
               "instance_job_id:gpu_held_idle_energy_joules:increase1m"}  # fmt: skip


def test_every_recording_rule_returns_data(stack: dict) -> None:
    shipped = yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())
    # the stack's rules are the shipped template with shorter windows: the memory window records are named by their
    # window (uuid:gpu_memory_used_bytes:mean5m there mean5s), the same rules otherwise
    records = [[r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
               for rules in (shipped, stack["rules"])]  # fmt: skip
    assert len(records[0]) == len(records[1])
    names = records[1]
    assert CROSS_NODE | CONDITIONAL <= set(names)
    # at some evaluation since the stack started: a rise record holds a series only while memory rises (the leak's
    # steps), so an instant query can fall between them
    empty = [
        n
        for n in names
        if n not in CROSS_NODE | CONDITIONAL and not query(stack["prom"], f"present_over_time({n}[1h])")
    ]
    assert empty == [], ", ".join(empty)
    # only the two Slurm jobs of the shared GPU's node are cluster-wide ids
    assert {r["metric"]["job_id"] for n in CROSS_NODE for r in query(stack["prom"], n)} <= {"4301", "4302"}


def _alerts(receiver: str | None = None) -> list[dict]:
    return [a for path, msg in Webhook.received if receiver in (None, path) for a in msg["alerts"]]


def _of(labels: dict, scenario: str) -> bool:
    """Whether alert labels come from a scenario's node (rules that aggregate keep instance, not target labels)."""
    return labels.get("scenario") == scenario or labels.get("instance") == f"127.0.0.1:{PORTS[scenario]}"


def _wait_for(receiver: str, alertname: str, scenario: str | None = None, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for a in _alerts(receiver):
            if a["labels"]["alertname"] == alertname and (scenario is None or _of(a["labels"], scenario)):
                return a
        time.sleep(0.5)
    seen = sorted({(p, a["labels"]["alertname"], a["labels"].get("scenario")) for p, m in Webhook.received
                   for a in m["alerts"]})  # fmt: skip
    raise AssertionError(f"{alertname} ({scenario}) never reached {receiver}; seen: {seen}")


def _wait_until(prom: str, expr: str, timeout: float = 200) -> None:
    """Wait until the instant query ``expr`` returns a series; AssertionError naming it after ``timeout`` s."""
    deadline = time.time() + timeout
    while not query(prom, expr):
        assert time.time() < deadline, f"{expr} returned nothing for {timeout} s"
        time.sleep(0.5)


def test_a_steady_95_percent_plateau_is_a_ticket_naming_the_job_not_a_page(stack: dict) -> None:
    mem = _wait_for("tickets", "GpuMemoryAlmostFull", "mem95")
    assert mem["labels"]["severity"] == "warning"
    # the job and its owner are labels (stable while the job holds the GPU); the process is in the description
    assert mem["labels"]["job_id"] and "pid" not in mem["labels"] and "process_name" not in mem["labels"]
    assert re.search(r"largest holder: python3 pid \d+, job ", mem["annotations"]["description"])
    assert "95%" in mem["annotations"]["description"]
    node = f"127.0.0.1%3A{PORTS['mem95']}"  # the instance, url-quoted: the link opens this node
    assert mem["annotations"]["dashboard_url"].startswith(
        f"https://grafana.example/d/gpuwarden-node/gpuwarden-node?var-instance={node}&var-gpu=0"
    )
    assert (
        mem["annotations"]["runbook_url"].startswith("https://")
        and "#gpumemoryalmostfull" in mem["annotations"]["runbook_url"]
    )
    assert [a for a in _alerts("pager") if _of(a["labels"], "mem95")] == []


def test_a_leak_after_its_plateau_pages_before_full_and_a_warmup_never(stack: dict) -> None:
    """The leak node's job holds 82% for 60 s, then grows 0.5% a second (full at 96 s); the warm-up node's job
    grows from 30% to 93% in 25 s and stays (the shapes of tools/memory_shapes.py, minutes as seconds)."""
    page = _wait_for("pager", "GpuMemoryFillingUp", "leak", timeout=150)
    used = float(re.search(r"is at ([\d.]+)% of its memory", page["annotations"]["description"]).group(1))
    assert 82 < used < 100, page["annotations"]["description"]
    assert "largest holder: python3 pid" in page["annotations"]["description"]
    assert page["labels"]["job_id"] and page["labels"]["user"], page["labels"]
    assert query(stack["prom"], 'max_over_time(uuid:gpu_memory_used_ratio:leaking{scenario="leak"}[10m])')
    # the warm-up, 90 s and more into its replay by now, was never even pending
    warm = 'ALERTS{alertname="GpuMemoryFillingUp", scenario="warmup"}'
    assert query(stack["prom"], f"count_over_time({warm}[10m])") == []
    assert [a for a in _alerts("pager") if _of(a["labels"], "warmup")] == []


def test_a_leak_in_the_second_job_of_a_shared_gpu_pages_its_owner_and_the_first_jobs_phases_never(stack: dict) -> None:
    """Two Slurm jobs on one GPU (derived-h100-memory-two-jobs, minutes as seconds): alice's job 4301 warms up slowly
    (5% -> 35%) and then runs an evaluation phase every 25 s (+10% in 4 s, released); bob's job 4302 holds 25% for 60 s,
    then leaks 0.6% a second until the GPU is full at 122 s. The page names bob's job before full, also while one of
    alice's phases rides on the leak (alice's phase reaches no higher than her earlier one: bob is past his own
    high-water mark); alice's job never fires (her first phase, +10% in 4 s, is a ramp like a leak's start for an
    evaluation or two: pending at most, never for the 2 s of ``for:``), nor once the GPU is full (bob's memory squeezed
    back by her phase, which ends a few megabytes above the one before: her warm-up's tail, below the rise floor;
    asked once bob's job has left the full GPU)."""
    page = _wait_for("pager", "GpuMemoryFillingUp", "twojobs", timeout=200)
    assert (page["labels"]["job_id"], page["labels"]["user"]) == ("4302", "bob"), page["labels"]
    used = float(re.search(r"is at ([\d.]+)% of its memory", page["annotations"]["description"]).group(1))
    assert used < 100, page["annotations"]["description"]
    assert "job 4302 of bob; growing: python3 pid 454" in page["annotations"]["description"]
    full = 'max_over_time(gpu_memory_used_bytes{scenario="twojobs"}[10m]) >= 0.99 * gpu_memory_total_bytes'
    _wait_until(stack["prom"], f'({full}) unless on (instance, gpu) gpu_process_memory_used_bytes{{pid="454"}}')
    alice = 'ALERTS{alertname="GpuMemoryFillingUp", scenario="twojobs", job_id="4301", alertstate="firing"}'
    assert query(stack["prom"], f"count_over_time({alice}[10m])") == []
    assert [a for a in _alerts("pager") if _of(a["labels"], "twojobs") and a["labels"].get("user") == "alice"] == []


def test_memory_held_idle_goes_to_its_owner(stack: dict) -> None:
    owner = _wait_for("owners", "GpuMemoryHeldIdle", "idle")
    assert owner["labels"]["notify"] == "owner" and owner["labels"]["user"] and owner["labels"]["job_id"]
    assert [a for a in _alerts("pager") if _of(a["labels"], "idle")] == []


def test_a_lost_gpu_pages_once_and_keeps_its_xid(stack: dict) -> None:
    lost = _wait_for("pager", "GpuLost", "lost")
    assert lost["labels"]["gpu"] == "3" and "79" in lost["annotations"]["description"]
    assert lost["labels"]["scenario"] == "lost"  # a target label, kept through the rule's aggregation
    # the job still running on it, whose memory NVML no longer gives, and its owner
    assert lost["labels"]["job_id"] and lost["labels"]["user"], lost["labels"]
    pages = [m for path, m in Webhook.received if path == "pager" and _of(m["commonLabels"], "lost")]
    # one page about the lost GPU (the replay reads it up for 2 polls of every 30: keep_firing_for holds it); any
    # other page of that node can only be its own scrapes failing on a loaded machine (1 s scrapes)
    assert sum(1 for m in pages for a in m["alerts"] if a["labels"]["alertname"] == "GpuLost") == 1, pages
    assert {a["labels"]["alertname"] for m in pages for a in m["alerts"]} <= {"GpuLost", "GpuwardenDown"}
    [xid] = query(stack["prom"], 'gpu_xid_errors_total{scenario="lost",gpu="3",xid="79"}')
    assert float(xid["value"][1]) >= 1
    # the replay loops: GPU 3 reads up for the 2 polls before its XID 79 at each pass (of 30), so look at 15 s
    [up] = query(stack["prom"], 'min_over_time(gpu_up{scenario="lost",gpu="3"}[15s])')
    assert up["value"][1] == "0"


def test_ecc_errors_present_at_start_page_and_stay_and_xid_63_does_not(stack: dict) -> None:
    ecc = _wait_for("pager", "GpuUncorrectableEccErrors", "ecc")
    assert ecc["labels"]["severity"] == "critical"
    firing = query(stack["prom"], 'ALERTS{alertname="GpuUncorrectableEccErrors",alertstate="firing",scenario="ecc"}')
    assert firing, "the alert must stay while the errors are there"
    assert [a for a in _alerts() if a["labels"].get("xid") == "63"] == []
    hot = [m for path, m in Webhook.received if path == "pager" and _of(m["commonLabels"], "ecc")]
    assert len(hot) == 1  # ECC errors and overheating on one GPU: one page


def test_one_slow_rank_among_8_gpus_raises_the_imbalance_alert(stack: dict) -> None:
    imb = _wait_for("chat", "GpuJobImbalanced", "lost")
    assert imb["labels"]["severity"] == "info"


def test_gpu_missing_after_a_restart_under_another_instance(stack: dict) -> None:
    missing = _wait_for("pager", "GpuMissing")
    assert missing["labels"]["nodename"] == "eight"
    assert missing["labels"]["instance"] == f"127.0.0.1:{PORTS['eight']}"  # the node's instance now


def test_info_alerts_are_one_chat_digest_naming_each_job_and_owner(stack: dict) -> None:
    """The 8 GPUs of the "lost" node's job starve and its job is imbalanced, as others elsewhere: one chat digest
    for the cluster carries them all (28 messages at once before), an alert a job (not a GPU), each naming its job and
    owner and counting its starved GPUs."""
    _wait_for("chat", "GpuStarved", "lost")  # sent after the group's wait
    msgs = [m for path, m in Webhook.received if path == "chat"]
    assert len(msgs) == 1, [m["groupLabels"] for m in msgs]
    [msg] = msgs
    starved = [a for a in msg["alerts"] if a["labels"]["alertname"] == "GpuStarved" and _of(a["labels"], "lost")]
    assert len(starved) == 1, [a["labels"] for a in msg["alerts"]]  # the job's GPUs: one alert
    [alert] = starved
    assert alert["labels"].get("job_id") and alert["labels"].get("user") and "gpu" not in alert["labels"]
    count = int(alert["annotations"]["description"].split(" GPU(s)")[0])
    assert count >= 2 and alert["annotations"]["description"].count(" GPU ") >= 2  # the most starved, named


def test_unrelated_nodes_sharing_a_local_job_id_raise_nothing(stack: dict) -> None:
    both = 'group by (job_id, scenario) (max_over_time(gpu_process_job_info{scenario=~"lost|eight"}[2m]))'
    shared = query(stack["prom"], f"count by (job_id) ({both}) == 2")
    assert shared, "the two traces were expected to share their (node-local) job id"
    assert [a for a in _alerts() if a["labels"]["alertname"] == "GpuJobImbalancedAcrossNodes"] == []


def _panel(board: str, title: str) -> list[str]:
    return next(exprs for b, t, exprs in dashboard_panels() if b == board and t == title)


def test_job_view_keeps_a_node_local_id_on_its_node_and_state_shares_add_to_one(stack: dict) -> None:
    """ "lost" and "eight" are unrelated nodes whose processes share one node-local (cgroup) job id: the job view of
    that id on one node counts that node only. The node view's state shares add to 100%."""
    prom = stack["prom"]
    both = 'group by (job_id) (gpu_process_job_info{scenario="lost"}) and on (job_id) group by (job_id) ' \
        '(gpu_process_job_info{scenario="eight"})'  # fmt: skip
    [shared] = [r["metric"]["job_id"] for r in query(prom, both)]
    values = {"job": ".*", "job_id": json.dumps(shared)[1:-1], "instance": f"127.0.0.1:{PORTS['lost']}", "gpu": ".*"}
    [nodes] = query(prom, substitute(_panel("gpuwarden-job", "Nodes")[0], values))
    [gpus] = query(prom, substitute(_panel("gpuwarden-job", "GPUs")[0], values))
    on_lost = query(prom, f'count(max by (gpu) (gpu_process_job_info{{scenario="lost", job_id="{values["job_id"]}"}}))')
    assert nodes["value"][1] == "1" and gpus["value"][1] == on_lost[0]["value"][1], (nodes, gpus, on_lost)
    node = {"job": ".*", "job_id": "x", "instance": f"127.0.0.1:{PORTS['eight']}", "gpu": ".*"}
    shares = query(prom, substitute(_panel("gpuwarden-node", "GPU time by state")[0], node))
    assert shares and abs(sum(float(r["value"][1]) for r in shares) - 1) < 1e-6, shares


def _gw_json(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "gpuwarden", *args, "--json"], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_gpu_lost_under_a_job_is_named_by_its_report_and_its_time_down_is_lost(stack: dict) -> None:
    """GPU 3 of "lost" falls off the bus 3 s into each 30 s replay of its trace while the job holds it: the job's
    report on that node names it, the same (node-local) job id on "eight" (no GPU down) names none, ``top``'s GPU
    table counts its time down under the cause ``lost``, never under held_idle (and none for GPU 0, never down), and
    the job, whose processes still run, is charged that time as lost."""
    prom = stack["prom"]
    both = 'group by (job_id) (gpu_process_job_info{scenario="lost"}) and on (job_id) group by (job_id) ' \
        '(gpu_process_job_info{scenario="eight"})'  # fmt: skip
    [job] = [r["metric"]["job_id"] for r in query(prom, both)]
    lost, eight = f"127.0.0.1:{PORTS['lost']}", f"127.0.0.1:{PORTS['eight']}"
    common = ("--prometheus", prom, "--range", "1m", "--step", "1s")
    doc = _gw_json("report", "--job", job, "--instance", lost, *common)
    assert doc["gpus_lost"] == [{"instance": lost, "gpu": "3", "node": "lost"}]
    assert _gw_json("report", "--job", job, "--instance", eight, *common)["gpus_lost"] == []
    gpus = {(g["instance"], g["gpu"]): g for g in _gw_json("top", *common, "--limit", "100")["gpus"]}
    causes = gpus[(lost, "3")]["lost_gpu_hours_by_cause"]
    assert max(causes, key=causes.get) == "lost" and causes["held_idle"] == 0, causes
    assert gpus[(lost, "0")]["lost_gpu_hours_by_cause"]["lost"] == 0
    # the job's processes still run: it keeps holding the lost GPU, whose time down is the job's lost time (the two
    # commands ask a second or two apart: within a few one-second scrapes)
    assert doc["lost_gpu_hours_by_cause"]["lost"] == pytest.approx(causes["lost"], abs=3 / 3600)
    assert causes["lost"] > 10 / 3600  # down 27 s of every 30 s replay
