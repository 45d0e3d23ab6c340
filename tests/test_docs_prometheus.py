"""docs/prometheus.md holds: its scrape configurations pass ``promtool check config``, its join queries give the right
answer under ``promtool test rules`` with several processes and jobs on one GPU, and its table of the recording rules
each dashboard needs is what the dashboards and the rule file say."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).parent.parent
DOC = (REPO / "docs" / "prometheus.md").read_text()
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (CI installs Debian's prometheus)")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, re.S)


def _queries() -> dict[str, str]:
    return dict(re.findall(r"<!-- query: (\w+) -->\n```promql\n(.*?)```", DOC, re.S))


@pytest.mark.e2e
@needs_promtool
@pytest.mark.parametrize("block", [b for b in _blocks("yaml") if "scrape_configs:" in b])
def test_scrape_configurations_pass_promtool(tmp_path: Path, block: str) -> None:
    config = yaml.safe_load(block)
    if "kubernetes_sd_configs" in block and not _has_kubernetes_sd(tmp_path):
        # Debian builds Prometheus without Kubernetes discovery: check the rest of the job (its relabelling) with
        # the discovery swapped for a static target
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": ["gpu-node-1:10400"]}] if job.pop("kubernetes_sd_configs") else []
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    res = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True, timeout=30, check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def _has_kubernetes_sd(tmp_path: Path) -> bool:
    probe = {"scrape_configs": [{"job_name": "k", "kubernetes_sd_configs": [{"role": "pod"}]}]}
    (tmp_path / "probe.yml").write_text(yaml.safe_dump(probe))
    res = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "probe.yml")], capture_output=True, text=True,
                         timeout=30, check=False)  # fmt: skip
    return "kubernetes_sd_configs not found" not in res.stdout + res.stderr


def test_the_doc_shows_static_file_sd_and_kubernetes_configurations() -> None:
    configs = [yaml.safe_load(b) for b in _blocks("yaml") if "scrape_configs:" in b]
    kinds = {k for c in configs for job in c["scrape_configs"] for k in job if k.endswith("_configs")}
    assert {"static_configs", "file_sd_configs", "kubernetes_sd_configs"} <= kinds
    target_file = next(yaml.safe_load(b) for b in _blocks("yaml") if b.startswith("- targets:"))
    assert target_file[0]["targets"] and target_file[0]["labels"]


def _series(metric: str, value: float, **labels: str) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in {"job": "gpuwarden", **labels}.items())
    return {"series": f"{metric}{{{body}}}", "values": f"{value}+0x5"}


def _info(instance: str, gpu: str, uuid: str, pid: str, job_id: str, scope: str, user: str) -> dict:
    return _series("gpu_process_job_info", 1, instance=instance, gpu=gpu, uuid=uuid, pid=pid, job_id=job_id,
                   job_kind="slurm" if scope == "cluster" else "process", job_scope=scope, container_id="", user=user,
                   process_name="python3")  # fmt: skip


#: Node n1: GPU 0 holds two processes of Slurm job 4242; GPU 1 one process of 4242 and one of the node-local job
#: "bob/jupyter"; GPU 2 none. Node n2: GPU 0 holds 4242 and another "bob/jupyter" (same id, an unrelated job).
GPUS = [("n1:10400", "0", "GPU-a", 0.2, 76), ("n1:10400", "1", "GPU-b", 0.4, 40), ("n1:10400", "2", "GPU-c", 0.0, 1),
        ("n2:10400", "0", "GPU-d", 0.6, 79)]  # fmt: skip
PROCS = [("n1:10400", "0", "GPU-a", "11", "4242", "cluster", "alice", 30), ("n1:10400", "0", "GPU-a", "12", "4242",
         "cluster", "alice", 40), ("n1:10400", "1", "GPU-b", "13", "4242", "cluster", "alice", 20),
         ("n1:10400", "1", "GPU-b", "14", "bob/jupyter", "node", "bob", 20),
         ("n2:10400", "0", "GPU-d", "15", "4242", "cluster", "alice", 70),
         ("n2:10400", "0", "GPU-d", "16", "bob/jupyter", "node", "bob", 9)]  # fmt: skip


def _input() -> list[dict]:
    out = []
    for inst, gpu, uuid, starved, used in GPUS:
        out.append(_series("gpu_starved_ratio", starved, instance=inst, gpu=gpu, uuid=uuid))
        out.append(_series("gpu_memory_used_bytes", used, instance=inst, gpu=gpu, uuid=uuid))
        out.append(_series("gpu_memory_total_bytes", 80, instance=inst, gpu=gpu, uuid=uuid))
        out.append(_series("gpu_info", 1, instance=inst, gpu=gpu, uuid=uuid, name="NVIDIA H100 80GB HBM3"))
    jobs = sorted({(inst, gpu, uuid, job_id, scope) for inst, gpu, uuid, _, job_id, scope, _, _ in PROCS})
    for inst, gpu, uuid, job_id, scope in jobs:  # one gpu_job_info per GPU and job, as the daemon exports it
        out.append(_series("gpu_job_info", 1, instance=inst, gpu=gpu, uuid=uuid, job_id=job_id,
                           job_kind="slurm" if scope == "cluster" else "process", job_scope=scope, namespace="",
                           pod="", container=""))  # fmt: skip
    for inst, gpu, uuid, pid, job_id, scope, user, mem in PROCS:
        out.append(_info(inst, gpu, uuid, pid, job_id, scope, user))
        out.append(_series("gpu_process_memory_used_bytes", mem, instance=inst, gpu=gpu, uuid=uuid, pid=pid,
                           process_name="python3"))  # fmt: skip
    return out


def _sample(value: float, **labels: str) -> dict:
    return {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}


def _expected() -> dict[str, list[dict]]:
    per_gpu = [_sample(s, instance=i, gpu=g, uuid=u, job_id=j) for i, g, u, s, _ in GPUS
               for j in sorted({p[4] for p in PROCS if p[2] == u})]  # fmt: skip
    return {
        # GPU 1 of n1 and GPU 0 of n2 appear once per job; GPU 0 of n1 once for its two processes; GPU 2 not at all
        "starved_by_gpu_and_job": per_gpu,
        "starved_by_gpu_and_job_info": [
            _sample(
                s,
                instance=i,
                job="gpuwarden",
                gpu=g,
                uuid=u,
                job_id=j,
                job_kind="slurm" if j == "4242" else "process",
                job_scope="cluster" if j == "4242" else "node",
            )
            for i, g, u, s, _ in GPUS
            for j in sorted({p[4] for p in PROCS if p[2] == u})
        ],  # fmt: skip
        # only the cluster-wide id: (0.2 + 0.4 + 0.6) / 3 over both nodes; "bob/jupyter" is not merged across nodes
        "starved_by_cluster_job": [_sample(0.4, job_id="4242")],
        "process_memory_with_job": [
            _sample(
                mem, instance=i, job="gpuwarden", gpu=g, uuid=u, pid=pid, process_name="python3", job_id=j, user=usr
            )
            for i, g, u, pid, j, _, usr, mem in PROCS
        ],
        "full_gpus_of_a_job": [
            _sample(0.95, instance="n1:10400", job="gpuwarden", gpu="0", uuid="GPU-a", name="NVIDIA H100 80GB HBM3"),
            _sample(79 / 80, instance="n2:10400", job="gpuwarden", gpu="0", uuid="GPU-d", name="NVIDIA H100 80GB HBM3"),
        ],
    }


def _promtool_test(
    tmp_path: Path, exprs: dict[str, str], expected: dict[str, list[dict]]
) -> subprocess.CompletedProcess[str]:
    test = {
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": _input(),
            "promql_expr_test": [{"expr": exprs[k], "eval_time": "2m", "exp_samples": expected[k]} for k in exprs],
        }],
    }  # fmt: skip
    (tmp_path / "queries.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "queries.test.yml")], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.e2e
@needs_promtool
def test_the_documented_joins_answer_right_with_several_processes_and_jobs_on_a_gpu(tmp_path: Path) -> None:
    queries = _queries()
    assert set(queries) == set(_expected()), "a documented query without a test, or a test without its query"
    res = _promtool_test(tmp_path, queries, _expected())
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.e2e
@needs_promtool
def test_the_naive_join_fails_on_a_gpu_with_two_processes(tmp_path: Path) -> None:
    # why the doc reduces the info series first: this join is what users write, and Prometheus refuses it
    naive = {"naive": "gpu_starved_ratio * on (gpu, uuid) group_left (job_id) gpu_process_job_info"}
    res = _promtool_test(tmp_path, naive, {"naive": []})
    assert res.returncode != 0 and "many-to-many" in res.stdout + res.stderr, res.stdout + res.stderr


RULE = r"[a-z_]*:[a-z_]+:[a-z0-9_]+"


def test_the_table_of_recording_rules_each_dashboard_needs_is_right() -> None:
    groups = yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())["groups"]
    rules = {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}
    table = {
        m.group(1): (set(re.findall(RULE, m.group(2))), set(re.findall(RULE, m.group(3))))
        for m in re.finditer(r"^\| (GPU \w+) \| (.*?) \| (.*?) \|$", DOC, re.M)
        if "`" in m.group(0) or "none" in m.group(0)
    }
    titles = {"fleet": "GPU fleet", "node": "GPU node", "job": "GPU job"}
    assert set(table) == set(titles.values())
    for stem, title in titles.items():
        board = REPO / "gpuwarden" / "mixin" / "dashboards" / f"gpuwarden-{stem}.json"
        panels = json.loads(board.read_text())["panels"]
        direct = {n for p in panels for t in p["targets"] for n in re.findall(RULE, t["expr"]) if n in rules}
        closure, todo = set(), list(direct)
        while todo:
            for dep in set(re.findall(RULE, rules[todo.pop()])) & set(rules):
                if dep not in closure and dep not in direct:
                    closure.add(dep)
                    todo.append(dep)
        assert table[title] == (direct, closure), title
