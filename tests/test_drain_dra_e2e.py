"""``gpuwarden drain --scheduler dra`` end to end: a real Prometheus scraping a daemon that replays a 4-GPU node, and
the stand-in API server (tests/kube_apiserver.py) serving resource.k8s.io/v1 as Kubernetes 1.37 does, every
DeviceTaintRule written checked against 1.37's published schema and the API server's validation of its fields.

The node's trace is derived from the real H100 recording ``h100-compute_bound`` (4 copies of its GPU with new UUIDs:
tools/make_8gpu_trace.py), written to the test's directory with ``modified`` in its header: GPU 1 with 3
uncorrectable volatile ECC errors in every record (a critical health rule: the service tier), GPU 2 with XID 63 at
the fifth poll (an XID outside the critical set: the watch tier), GPUs 0 and 3 as recorded. The cluster has a second
node of 4 GPUs in its ResourceSlices. Then the daemon replays the same 4 GPUs unmodified, and the rules go."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES
from helpers import REPO, free_port, prometheus, scraping, stop_all, wait_http
from kube_apiserver import ApiServer, resource_slice
from prometheus_client.parser import text_string_to_metric_families
from slurm_node import serve_replay, wait_for

from gpuwarden.cluster.dra import rule_name
from gpuwarden.model import XidEvent

_spec = importlib.util.spec_from_file_location("make_8gpu_trace", REPO / "tools" / "make_8gpu_trace.py")
assert _spec is not None and _spec.loader is not None
_derived = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_derived)
derive, write = _derived.derive, _derived.write

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed")]
RANGE = "20s"
NODE = "gpu-node-1"


def _traces(where: Path) -> tuple[Path, Path, list[str]]:
    """The sick and the clean 4-GPU traces (see the module) and the GPUs' UUIDs."""
    header, polls = derive(TRACES / "h100-compute_bound.jsonl.gz", 4)
    clean = where / "derived-4gpu-clean.jsonl.gz"
    write(clean, header, polls)
    sick_polls = []
    for n, p in enumerate(polls):
        gpus = []
        for g in p.gpus:
            if g.index == 1:
                g = g.model_copy(update={"ecc_errors_total": {**g.ecc_errors_total, "uncorrected_volatile": 3}})
            elif g.index == 2 and n == 4:
                g = g.model_copy(update={"xid_events": [XidEvent(timestamp=g.timestamp, xid=63)]})
            gpus.append(g)
        sick_polls.append(p.model_copy(update={"gpus": gpus}))
    note = f"{header.metadata['modified']} Then GPU 1 given 3 uncorrected_volatile ECC errors in every record and GPU 2 XID 63 at poll 5 (tests/test_drain_dra_e2e.py)."  # noqa: E501
    sick = where / "derived-4gpu-sick.jsonl.gz"
    write(sick, header.model_copy(update={"metadata": {**header.metadata, "modified": note}}), sick_polls)
    return sick, clean, [g.uuid for g in header.node.gpus]


def _drain(url: str, api: str, textfile: Path, *extra: str) -> list[dict]:
    res = subprocess.run([sys.executable, "-m", "gpuwarden", "drain", "--scheduler", "dra", "--kube-api", api,
                          "--prometheus", url, "--range", RANGE, "--step", "1s", "--json", "--textfile",
                          str(textfile), *extra], capture_output=True, text=True, cwd=REPO, timeout=120,
                         check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["actions"]


def _seen(api: ApiServer) -> dict[str, str]:
    """What the scheduler sees: each rule's selected device and its taint."""
    return {f"{r['spec']['deviceSelector']['pool']}/{r['spec']['deviceSelector']['device']}":
            f"{r['spec']['taint']['key']}={r['spec']['taint']['value']}:{r['spec']['taint']['effect']}"
            for r in api.rules.values()}  # fmt: skip


def _metric(textfile: Path, name: str) -> float:
    return next(s.value for f in text_string_to_metric_families(textfile.read_text()) for s in f.samples
                if s.name == name)  # fmt: skip


def test_only_the_bad_gpu_is_tainted_the_watched_one_marked_and_both_given_back_once_clean(tmp_path: Path) -> None:
    sick, clean, uuids = _traces(tmp_path)
    port = free_port()
    server, url = prometheus(PROMETHEUS or "prometheus", tmp_path, scraping(port))
    procs: list[subprocess.Popen] = [server]
    textfile = tmp_path / "gpuwarden_drain.prom"
    other = [f"GPU-ffffffff-0000-0000-0000-00000000000{i}" for i in range(4)]
    slices = [resource_slice(NODE, uuids), resource_slice("gpu-node-2", other)]
    try:
        with ApiServer([], slices=slices) as api:
            procs.append(serve_replay(sick, port, tmp_path / "sick.log", GPUWARDEN_NODE_NAME=NODE))
            wait_http(f"{url}/-/ready")
            steps: list[tuple[str, object]] = []
            both = lambda: len(_drain(url, api.url, textfile, "--max-out-ratio", "0.5")) == 2  # noqa: E731
            wait_for("GPU 1 and GPU 2 planned", both, 90)
            planned = _drain(url, api.url, textfile, "--max-out-ratio", "0.5")
            assert [(a["action"], a["node"], a["gpu"], a["effect"], a["status"]) for a in planned] == [
                ("drain", NODE, "1", "NoSchedule", "planned"), ("watch", NODE, "2", "None", "planned")]  # fmt: skip
            assert "uncorrectable ECC" in planned[0]["reason"] and "XID 63" in planned[1]["reason"]
            assert [r for r in api.requests if r[0] != "GET"] == []  # a dry run writes nothing
            steps.append(("dry run", _seen(api)))
            # outside a pod without --kube-api: a dry run from Prometheus alone, said in one line
            bare = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
            alone = subprocess.run([sys.executable, "-m", "gpuwarden", "drain", "--scheduler", "dra", "--prometheus",
                                    url, "--range", RANGE, "--step", "1s"], capture_output=True, text=True, cwd=REPO,
                                   env=bare, timeout=120, check=False)  # fmt: skip
            assert alone.returncode == 0 and alone.stderr.count("\n") == 1, alone.stderr
            assert "a dry run from Prometheus alone" in alone.stderr and "--kube-api" in alone.stderr
            lines = [line.split("\t")[:3] for line in alone.stdout.splitlines()]
            assert lines == [["drain (NoSchedule)", f"{NODE} GPU 1", "planned"],
                             ["watch (None)", f"{NODE} GPU 2", "planned"]]  # fmt: skip
            # 8 GPUs at --max-out-ratio 0.1: not one may be out; the watch (effect None) takes nothing out
            capped = _drain(url, api.url, textfile, "--apply", "--max-out-ratio", "0.1")
            assert [(a["action"], a["gpu"], a["status"]) for a in capped] == [("refuse", "1", "refused"),
                                                                               ("watch", "2", "done")]  # fmt: skip
            assert "would take 1 of 8 GPUs out" in capped[0]["reason"]
            assert _seen(api) == {f"{NODE}/gpu-2": "gpuwarden.io/gpu-service=watch:None"}
            steps.append(("--apply --max-out-ratio 0.1", _seen(api)))
            done = _drain(url, api.url, textfile, "--apply", "--max-out-ratio", "0.5")
            assert [(a["action"], a["gpu"], a["status"]) for a in done] == [("drain", "1", "done")]
            assert _seen(api) == {f"{NODE}/gpu-1": "gpuwarden.io/gpu-service=service:NoSchedule",
                                  f"{NODE}/gpu-2": "gpuwarden.io/gpu-service=watch:None"}  # fmt: skip
            rule = api.rules[rule_name(uuids[1])]
            assert rule["metadata"]["annotations"]["gpuwarden.io/gpu"] == f"{NODE} GPU 1 {uuids[1]}"
            assert rule["spec"]["taint"]["timeAdded"]  # the server's, as the API server sets it
            assert api.rejected == []
            assert _metric(textfile, "gpuwarden_drain_gpus_held_out") == 1
            assert _metric(textfile, "gpuwarden_drain_gpus") == 8
            steps.append(("--apply --max-out-ratio 0.5", _seen(api)))
            assert _drain(url, api.url, textfile, "--apply", "--max-out-ratio", "0.5") == []  # as wanted: nothing
            stop_all(procs[1:])
            procs[1:] = [serve_replay(clean, port, tmp_path / "clean.log", GPUWARDEN_NODE_NAME=NODE)]
            resumed: list[dict] = []

            def resume() -> bool:
                resumed.extend(_drain(url, api.url, textfile, "--apply", "--max-out-ratio", "0.5"))
                return not api.rules

            wait_for("runs that give both GPUs back", resume, 120)
            given_back = sorted((a["action"], a["gpu"], a["status"]) for a in resumed)
            assert given_back == [("resume", "1", "done"), ("resume", "2", "done")], resumed
            assert api.rules == {} and api.rejected == []
            assert _metric(textfile, "gpuwarden_drain_gpus_held_out") == 0
            steps.append(("clean over the range, --apply", _seen(api)))
            print(json.dumps(steps, indent=1))  # what the scheduler saw at each step (pytest -s)
    finally:
        stop_all(procs)
