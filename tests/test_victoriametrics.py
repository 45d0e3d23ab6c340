"""``top`` and ``report`` against VictoriaMetrics (Debian's ``victoria-metrics``, single-node) and a real Prometheus
holding the same three and a half hours of series (tests/fleet_series.py: scrapes at each node's offset with jitter,
missed ones, a 4-minute gap, daemons restarted, a 64-GPU, an 8-GPU and 1-GPU jobs), VictoriaMetrics' through its
Prometheus text import API, Prometheus's backfilled by promtool: every job's and GPU's held, busy and lost hours
within 1% of what the counters grew on both engines, at several ranges (5 minutes to 3 hours), range ends, steps
and attribution steps (``--step``, ``--resolution``), the daemons' restarts before and inside the range. MetricsQL
answers the accounting's PromQL (subqueries, negative offsets, ``last_over_time`` look backs) as Prometheus does."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fleet_series import BIG, EIGHT, HELD, JOBS, SLUID, Fleet, hours
from helpers import backfilled_prometheus, cli_json, served, stop_all

VICTORIA = shutil.which("victoria-metrics")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(VICTORIA is None, reason="victoria-metrics not installed"),
    pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool not installed"),
    pytest.mark.xdist_group("victoriametrics"),  # both engines built once, on one worker
]
#: (range, its end in seconds after the series start, --step, --resolution or None): the daemons of beta's n1 and
#: alpha's b3 restart at 4995 s (back at 5025 s): inside the 15-minute and longer ranges, before the 5-minute one;
#: alpha's n2 is unscraped from 8145 s for 4 minutes, inside the 1-hour and 3-hour ones.
CASES = [
    ("5m", 5407.3, "1m", None),
    ("15m", 5407.3, "5s", None),
    ("15m", 5407.3, "5m", "1m"),
    ("1h", 3 * 3600 + 907.3, "1m", None),
    ("1h", 3 * 3600 + 900, "1m", "5s"),
    ("3h", 3 * 3600 + 907.3, "1h", None),
]


@contextmanager
def _both(tmp: Path, series: Fleet) -> Iterator[dict]:
    """VictoriaMetrics and a Prometheus holding ``series``: {"victoriametrics": URL, "prometheus": URL}."""
    assert VICTORIA is not None
    data = tmp / "data"
    server, url = served(lambda port: [VICTORIA, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
                                       "-retentionPeriod=10y", "-loggerLevel=ERROR"], "/health")  # fmt: skip
    try:
        lines = []
        for (metric, labels), points in sorted(series.samples().items()):
            sel = ",".join(f'{k}="{v}"' for k, v in labels)
            lines += [f"{metric}{{{sel}}} {v} {round(t * 1000)}" for t, v in points]  # milliseconds
        done = httpx.post(f"{url}/api/v1/import/prometheus", content="\n".join(lines) + "\n", timeout=300)
        assert done.status_code == 204, done.text
        httpx.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()
        (tmp / "prometheus").mkdir()
        with backfilled_prometheus(PROMETHEUS, PROMTOOL, tmp / "prometheus", series.openmetrics()) as prom:
            yield {"victoriametrics": url, "prometheus": prom}
    finally:
        stop_all([server])


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    t0 = (int(time.time()) // 3600 - 5) * 3600
    series = Fleet(t0, hours=3.5)
    with _both(tmp_path_factory.mktemp("engines"), series) as urls:
        yield {**urls, "t0": t0, "series": series}


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A day and a half hour of the two clusters' n1 and n2 nodes (6 GPUs): the handover, the restart and the
    4-minute gap all inside the day that ends at its last half hour."""
    t0 = (int(time.time()) // 3600 - 26) * 3600
    series = Fleet(t0, hours=24.5, nodes=(("alpha", "n1:9400"), ("alpha", "n2:9400"), ("beta", "n1:9400")))
    with _both(tmp_path_factory.mktemp("day"), series) as urls:
        yield {**urls, "t0": t0, "series": series}


def _flags(engines: dict, engine: str, range_: str, end: float, resolution: str | None) -> list[str]:
    flags = ["--prometheus", engines[engine], "--range", range_, "--at", str(engines["t0"] + end)]
    return flags + (["--resolution", resolution] if resolution else [])


@pytest.mark.parametrize("engine", ["victoriametrics", "prometheus"])
@pytest.mark.parametrize(("range_", "end", "step", "resolution"), CASES)
def test_top_is_the_counters_for_every_job_and_gpu_on_both_engines(
    engines: dict, engine: str, range_: str, end: float, step: str, resolution: str | None
) -> None:
    from gpuwarden.cluster.durations import seconds

    at = engines["t0"] + end
    truth = engines["series"].truth(at - seconds(range_), at)
    flags = _flags(engines, engine, range_, end, resolution)
    doc = cli_json("top", *flags, "--step", step, "--source", "raw", "--limit", "1")
    gpus = {(g["cluster"]["cluster"], g["instance"], g["gpu"]): g for g in doc["gpus"]}
    assert set(gpus) == set(truth.gpu_states)
    for key, states in truth.gpu_states.items():
        assert gpus[key]["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
        assert gpus[key]["busy_gpu_hours"] == pytest.approx(hours(states, "busy"), rel=0.01, abs=1e-6), key
    held = sum(g["held_gpu_hours"] for g in doc["gpus"])
    assert held <= len(gpus) * seconds(range_) / 3600 + 1e-9  # never more than the GPUs can hold
    jobs = {(j["job_id"], j["instance"], j["cluster"]["cluster"]): j for j in doc["jobs"]}
    assert set(jobs) == set(truth.job_states)
    assert {k for k in jobs if k[0] == SLUID} == {(SLUID, None, "alpha"), (SLUID, None, "beta")}
    for key, states in truth.job_states.items():
        assert jobs[key]["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
        assert jobs[key]["busy_gpu_hours"] == pytest.approx(hours(states, "busy"), rel=0.01, abs=1e-6), key
        for cause in {c for *_, c in JOBS.values()}:
            got = jobs[key]["lost_gpu_hours_by_cause"][cause]
            assert got == pytest.approx(hours(truth.job_causes[key], cause), rel=0.01, abs=1e-6), (key, cause)


@pytest.mark.parametrize("engine", ["victoriametrics", "prometheus"])
@pytest.mark.parametrize(("job", "gpus"), [("4242", 1), (EIGHT, 8), (BIG, 64)])
def test_report_of_jobs_of_1_8_and_64_gpus_is_their_counters_on_both_engines(
    engines: dict, engine: str, job: str, gpus: int
) -> None:
    """A 64-GPU job's report is asked in parts of NARROW_GPUS GPUs (no query of it past VictoriaMetrics' 16 KiB);
    the range holds b3's restart."""
    range_, end = "3h", 3 * 3600 + 907.3
    at = engines["t0"] + end
    truth = engines["series"].truth(at - 3 * 3600, at).job_states[(job, None, "alpha")]
    doc = cli_json("report", "--job", job, *_flags(engines, engine, range_, end, None))
    assert len(doc["gpus"]) == gpus
    assert doc["held_gpu_hours"] == pytest.approx(hours(truth, *HELD), rel=0.01)
    assert doc["busy_gpu_hours"] == pytest.approx(hours(truth, "busy"), rel=0.01)


@pytest.mark.parametrize("engine", ["victoriametrics", "prometheus"])
def test_a_day_of_top_and_report_is_the_counters_on_both_engines(day: dict, engine: str) -> None:
    end = 24 * 3600 + 1807.3
    at = day["t0"] + end
    truth = day["series"].truth(at - 86400, at)
    doc = cli_json("top", *_flags(day, engine, "1d", end, None), "--source", "raw", "--limit", "1")
    gpus = {(g["cluster"]["cluster"], g["instance"], g["gpu"]): g for g in doc["gpus"]}
    assert set(gpus) == set(truth.gpu_states)
    for key, states in truth.gpu_states.items():
        assert gpus[key]["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
        assert gpus[key]["busy_gpu_hours"] == pytest.approx(hours(states, "busy"), rel=0.01, abs=1e-6), key
    jobs = {(j["job_id"], j["instance"], j["cluster"]["cluster"]): j for j in doc["jobs"]}
    assert set(jobs) == set(truth.job_states)
    for key, states in truth.job_states.items():
        assert jobs[key]["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
    report = cli_json("report", "--job", "4343", *_flags(day, engine, "1d", end, None))
    assert report["held_gpu_hours"] == pytest.approx(hours(truth.job_states[("4343", None, "alpha")], *HELD), rel=0.01)


@pytest.mark.parametrize("engine", ["victoriametrics", "prometheus"])
def test_reclaim_facts_from_range_queries_are_the_instant_queries_at_every_tick_on_both_engines(
    engines: dict, engine: str
) -> None:
    """``reclaim --report`` and the controller's warm-up ask each tick's questions through range queries
    (gpuwarden.cluster.stepped): at each of 100 one-minute ticks (b3's and n1's restarts and n2's 4-minute gap among
    them), in windows of 37 ticks, every job's facts are what the same questions asked as instant queries at that
    tick give, and a handful of requests asked them."""
    from gpuwarden.cluster.promapi import Prometheus
    from gpuwarden.cluster.stepped import SteppedQueries
    from gpuwarden.reclaim.controller import Controller, ticks
    from gpuwarden.reclaim.policy import Policy

    policy = Policy.model_validate({"interval": "1m", "steps": [{"name": "notify", "after": "5m"}],
                                    "reclaimable_causes": ["held_idle", "paused"]})  # fmt: skip
    url = engines[engine]
    controller = Controller(policy, lambda: Prometheus(url), dry_run=True)
    end = engines["t0"] + 3 * 3600
    times = ticks(end - 100 * 60, end, 60)
    prom = Prometheus(url, timeout=300)
    stepped = SteppedQueries(prom, times, 60, window=37)
    seen = set()
    for at in times:
        ranged = controller.facts(at, stepped)
        assert ranged == controller.facts(at), at - engines["t0"]
        seen |= {(k.job_id, bool(f.reasons)) for k, f in ranged.items()}
    prom.close()
    assert {job for job, _ in seen} >= {"4343", EIGHT, BIG} and any(flagged for _, flagged in seen)
    questions = len({q for q in stepped._windows} | stepped._instant)
    assert not stepped._instant and stepped.requests <= questions * 3 + 10, stepped.requests
