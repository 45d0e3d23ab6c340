"""``top`` and ``report`` against VictoriaMetrics (Debian's ``victoria-metrics``, single-node) holding the same three
hours of two clusters' series as the Prometheus of test_fleet_exactness.py (tests/fleet_series.py, imported through
its Prometheus text import API): every job's and GPU's held, busy and lost hours within 1% of what the counters grew,
at 1-minute and 5-minute steps. MetricsQL answers the accounting's PromQL (subqueries, negative offsets) as
Prometheus does."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from fleet_series import HELD, JOBS, SLUID, Fleet, hours
from helpers import cli_json, free_port, stop_all, wait_http

VICTORIA = shutil.which("victoria-metrics")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(VICTORIA is None, reason="victoria-metrics not installed")]
RANGE_S = 3 * 3600


@pytest.fixture(scope="module")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("victoria")
    t0 = (int(time.time()) // 3600 - 5) * 3600
    series = Fleet(t0, hours=3.5)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([VICTORIA, f"-storageDataPath={tmp / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
                               "-retentionPeriod=10y", "-loggerLevel=ERROR"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_http(f"{url}/health", proc=server)
        lines = []
        for (metric, labels), points in sorted(series.samples().items()):
            sel = ",".join(f'{k}="{v}"' for k, v in labels)
            lines += [f"{metric}{{{sel}}} {v} {t * 1000}" for t, v in points]  # milliseconds
        done = httpx.post(f"{url}/api/v1/import/prometheus", content="\n".join(lines) + "\n", timeout=120)
        assert done.status_code == 204, done.text
        httpx.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()
        at = t0 + 15 * 60 + RANGE_S + 7.3  # as test_fleet_exactness: on no step's multiple, between two scrapes
        yield {"url": url, "at": at, "truth": series.truth(at - RANGE_S, at)}
    finally:
        stop_all([server])


@pytest.mark.parametrize("step", ["1m", "5m"])
def test_top_on_victoriametrics_is_the_counters_for_every_job_and_gpu(victoria: dict, step: str) -> None:
    doc = cli_json("top", "--prometheus", victoria["url"], "--range", "3h", "--at", str(victoria["at"]), "--step", step,
             "--source", "raw")  # fmt: skip
    truth = victoria["truth"]
    gpus = {(g["cluster"]["cluster"], g["instance"], g["gpu"]): g for g in doc["gpus"]}
    assert set(gpus) == set(truth.gpu_states)
    for key, states in truth.gpu_states.items():
        assert gpus[key]["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
        assert gpus[key]["busy_gpu_hours"] == pytest.approx(hours(states, "busy"), rel=0.01, abs=1e-6), key
    jobs = {(j["job_id"], j["instance"], j["cluster"]["cluster"]): j for j in doc["jobs"]}
    assert set(jobs) == set(truth.job_states)
    assert {k for k in jobs if k[0] == SLUID} == {(SLUID, None, "alpha"), (SLUID, None, "beta")}
    for key, states in truth.job_states.items():
        assert jobs[key]["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
        assert jobs[key]["busy_gpu_hours"] == pytest.approx(hours(states, "busy"), rel=0.01, abs=1e-6), key
        for cause in {c for *_, c in JOBS.values()}:
            got = jobs[key]["lost_gpu_hours_by_cause"][cause]
            assert got == pytest.approx(hours(truth.job_causes[key], cause), rel=0.01, abs=1e-6), (key, cause)


def test_report_on_victoriametrics_of_a_job_that_handed_its_gpu_over(victoria: dict) -> None:
    truth = victoria["truth"].job_states[("4242", None, "alpha")]
    doc = cli_json(
        "report", "--job", "4242", "--prometheus", victoria["url"], "--range", "3h", "--at", str(victoria["at"])
    )
    assert doc["held_gpu_hours"] == pytest.approx(hours(truth, *HELD), rel=0.01)
    assert doc["busy_gpu_hours"] == pytest.approx(hours(truth, "busy"), rel=0.01)
    assert len(doc["gpus"]) == 1
