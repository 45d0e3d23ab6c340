"""``top`` and ``report`` against a real Prometheus holding three hours of two clusters' series (backfilled with
``promtool tsdb create-blocks-from openmetrics``; tests/fleet_series.py says what they hold and computes what their
counters say, sample by sample): the same GPU-hours at 5-second, 1-minute, 5-minute and 1-hour steps, fleet, per
GPU and per job, within 1% of the counters and of hand-written PromQL; one job id in two clusters is two jobs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from fleet_series import HELD, JOBS, REASON, SCRAPE, SLUID, Fleet, hours
from helpers import REPO, backfilled_prometheus, cli_json

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool not installed"),
]
RANGE_S = 3 * 3600
STEPS = ["5s", "1m", "5m", "1h"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("fleet")
    t0 = (int(time.time()) // 3600 - 5) * 3600  # hours old, well inside the default retention
    series = Fleet(t0, hours=3.5)
    # the usage records as the shipped rules make them (gpuwarden.usage), backfilled over the series
    [group] = [g for g in yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())["groups"]
               if g["name"] == "gpuwarden.usage"]  # fmt: skip
    (tmp / "usage.rules.yml").write_text(yaml.safe_dump({"groups": [group]}))
    passes = [(tmp / "usage.rules.yml", t0, t0 + 3.5 * 3600)]
    with backfilled_prometheus(PROMETHEUS, PROMTOOL, tmp, series.openmetrics(), passes) as url:
        at = t0 + 15 * 60 + RANGE_S + 7.3  # the range's end: on no step's multiple, between two scrapes
        phase = hand(url, "max(timestamp(uuid_job_id:gpu_job_share:ratio1m))", at) % 60  # the records' second
        yield {"url": url, "at": at, "truth": series.truth(at - RANGE_S, at), "phase": phase}


def hand(url: str, expr: str, at: float) -> float:
    """One number from hand-written PromQL at ``at``."""
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr, "time": at}, timeout=30).json()
    assert body["status"] == "success", body
    [sample] = body["data"]["result"]
    return float(sample["value"][1])


@pytest.fixture(scope="module")
def tops(fleet: dict) -> dict[str, dict]:
    common = ["--prometheus", fleet["url"], "--range", "3h", "--at", str(fleet["at"]), "--source", "raw"]
    return {step: cli_json("top", *common, "--step", step, "--limit", "1") for step in STEPS}


@pytest.mark.parametrize("step", STEPS)
def test_every_gpu_and_the_fleet_are_their_counters_at_any_step(fleet: dict, tops: dict, step: str) -> None:
    truth = fleet["truth"]
    gpus = {(g["cluster"]["cluster"], g["instance"], g["gpu"]): g for g in tops[step]["gpus"]}
    assert set(gpus) == set(truth.gpu_states)  # n1:9400 twice: once in each cluster
    for key, states in truth.gpu_states.items():
        g = gpus[key]
        assert g["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
        assert g["busy_gpu_hours"] == pytest.approx(hours(states, "busy"), rel=0.01, abs=1e-6), key
        assert g["free_gpu_hours"] == pytest.approx(hours(truth.gpu_causes[key], "free"), rel=0.01, abs=1e-6), key
    fleet_held = sum(g["held_gpu_hours"] for g in tops[step]["gpus"])
    assert fleet_held == pytest.approx(sum(hours(s, *HELD) for s in truth.gpu_states.values()), rel=0.01)
    # by hand: alpha's counters but b3's (no restart there) at the range's end minus at its start
    held = 'sum(gpu_state_seconds_total{cluster="alpha", instance!="b3:9400", state!="free"} @ END)'
    start = fleet["at"] - RANGE_S
    by_hand = (hand(fleet["url"], held.replace("END", f"{fleet['at']:.3f}"), fleet["at"])
               - hand(fleet["url"], held.replace("END", f"{start:.3f}"), fleet["at"])) / 3600  # fmt: skip
    alpha = sum(g["held_gpu_hours"] for g in tops[step]["gpus"]
                if g["cluster"]["cluster"] == "alpha" and g["instance"] != "b3:9400")  # fmt: skip
    assert alpha == pytest.approx(by_hand, rel=0.01)


@pytest.mark.parametrize("step", STEPS)
def test_every_job_is_its_counters_at_any_step_and_one_id_in_two_clusters_is_two_jobs(
    fleet: dict, tops: dict, step: str
) -> None:
    truth = fleet["truth"]
    jobs = {(j["job_id"], j["instance"], j["cluster"]["cluster"]): j for j in tops[step]["jobs"]}
    assert len(tops[step]["jobs"]) == len(truth.job_states) == 7  # complete, whatever --limit
    assert {k for k in jobs if k[0] == SLUID} == {(SLUID, None, "alpha"), (SLUID, None, "beta")}
    for key, states in truth.job_states.items():
        j = jobs[key]
        assert j["held_gpu_hours"] == pytest.approx(hours(states, *HELD), rel=0.01, abs=1e-6), key
        assert j["busy_gpu_hours"] == pytest.approx(hours(states, "busy"), rel=0.01, abs=1e-6), key
        causes = truth.job_causes[key]
        for cause in {c for *_, c in JOBS.values()}:
            got = j["lost_gpu_hours_by_cause"][cause]
            assert got == pytest.approx(hours(causes, cause), rel=0.01, abs=1e-6), (key, cause)
    assert len(jobs[(SLUID, None, "alpha")]["gpus"]) == 2 and len(jobs[(SLUID, None, "beta")]["gpus"]) == 1
    # by hand: alpha's SLUID held both GPUs of alpha's n1 the whole range
    sel = 'cluster="alpha", instance="n1:9400"'
    busy = f'sum(gpu_state_seconds_total{{{sel}, state="busy"}} @ END)'
    start = fleet["at"] - RANGE_S
    by_hand = (hand(fleet["url"], busy.replace("END", f"{fleet['at']:.3f}"), fleet["at"])
               - hand(fleet["url"], busy.replace("END", f"{start:.3f}"), fleet["at"])) / 3600  # fmt: skip
    assert jobs[(SLUID, None, "alpha")]["busy_gpu_hours"] == pytest.approx(by_hand, rel=0.01)


def test_report_of_a_job_that_handed_its_gpu_over_mid_step(fleet: dict) -> None:
    """Slurm job 4242 held alpha's n2 GPU 0 until a scrape within a 5-minute and a 1-hour step: its report is its
    counters' at every step."""
    truth = fleet["truth"].job_states[("4242", None, "alpha")]
    for step in STEPS:
        at = str(fleet["at"])
        doc = cli_json(
            "report", "--job", "4242", "--prometheus", fleet["url"], "--range", "3h", "--at", at, "--step", step
        )
        assert doc["held_gpu_hours"] == pytest.approx(hours(truth, *HELD), rel=0.01), step
        assert doc["busy_gpu_hours"] == pytest.approx(hours(truth, "busy"), rel=0.01), step


def test_top_from_the_usage_records_is_within_1_percent_of_the_counters(fleet: dict) -> None:
    """Over a range past an hour ``top`` reads the usage records (the rules' gpuwarden.usage group, backfilled by
    promtool as Prometheus makes them): every job's and GPU's held, busy and lost hours within 1% of what the counters
    grew, one id in two clusters two jobs, the GPUs each job held."""
    doc = cli_json("top", "--prometheus", fleet["url"], "--range", "3h", "--at", str(fleet["at"]), "--limit", "1")
    assert doc["source"] == "recorded"
    truth = fleet["truth"]
    jobs = {(j["job_id"], j["instance"], j["cluster"]["cluster"]): j for j in doc["jobs"]}
    assert set(jobs) == set(truth.job_states)
    missing = doc["records_missing_ratio"] or 0.0

    def near(got: float, want: float, edges: float, why: object, rel: float = 0.01) -> None:
        assert got == pytest.approx(want, rel=rel, abs=edges + missing * want), why

    for key, states in truth.job_states.items():
        j = jobs[key]
        held = hours(states, *HELD)
        # within 1%, or a record interval (a minute) a GPU at each end of the range where the job held it across, and
        # the share of the records missing, by which top says its hours are low (records_missing_ratio). The records'
        # evaluation second is the rules group's offset, which Prometheus derives from the rule file's path, so each
        # run has its own; promtool's backfill writes no record for an evaluation due in the last second before a
        # 2-hour block's end (measured: at phases 59.2-59.9 s two of the range's evaluations are missing, 0.76%, and
        # 4343 reads 2.25 minutes low; at phases 0.1-58.1 s none, and every job is within a minute a GPU end)
        edges = 2 * len(j["gpus"]) / 60
        why = (key, f"records missing {missing}", f"usage rules phase {fleet['phase']:.3f} s")
        near(j["held_gpu_hours"], held, edges, why)
        near(j["busy_gpu_hours"], hours(states, "busy"), edges, why)
        for cause in {c for *_, c in JOBS.values()}:
            near(j["lost_gpu_hours_by_cause"][cause], hours(truth.job_causes[key], cause), edges, (*why, cause))
        # the main reason; a GPU changing hands gives its minute's reasons to the job that held it most of it
        assert j["verdict"][0] == REASON[key[0]], key
        # effective: the scrapes with util.gpu >= 0.5, 15 s each, while the job held the GPU
        effective = j["held_gpu_hours"] if JOBS[key[0]][2] >= SCRAPE / 2 else 0.0
        assert j["effective_gpu_hours"] == pytest.approx(effective, rel=0.01, abs=0.01 * held), key
    fleet_held = sum(hours(s, *HELD) for s in truth.job_states.values())
    assert sum(j["held_gpu_hours"] for j in doc["jobs"]) == pytest.approx(fleet_held, rel=0.01 + missing)  # the fleet's
    assert len(jobs[(SLUID, None, "alpha")]["gpus"]) == 2 and len(jobs[(SLUID, None, "beta")]["gpus"]) == 1
    gpus = {(g["cluster"]["cluster"], g["instance"], g["gpu"]): g for g in doc["gpus"]}
    assert set(gpus) == set(truth.gpu_states)
    for key, states in truth.gpu_states.items():
        held = hours(states, *HELD) + hours(truth.gpu_causes[key], "free")
        near(gpus[key]["held_gpu_hours"], hours(states, *HELD), 0.01 * held, key)
        near(gpus[key]["free_gpu_hours"], hours(truth.gpu_causes[key], "free"), 0.01 * held, key, rel=0.0)
    raw = cli_json("top", "--prometheus", fleet["url"], "--range", "3h", "--at", str(fleet["at"]), "--source", "raw")
    assert raw["source"] == "raw"
    asked = subprocess.run([sys.executable, "-m", "gpuwarden", "top", "--prometheus", fleet["url"], "--range", "3h",
                            "--at", str(fleet["at"] + 30 * 86400), "--source", "recorded"], capture_output=True,
                           text=True, cwd=REPO, timeout=120, check=False)  # fmt: skip
    assert asked.returncode == 1 and "do not cover the last 3h" in asked.stderr and "--source raw" in asked.stderr


@pytest.mark.parametrize(
    "value",
    ["plain", 'a"b\\c', "line\nbreak", "tab\tcr\r\x00\x07\x1b[2J", "ünïcødé ✓ 😀", "\\n literal", "'single'"],
)
def test_label_values_reach_the_query_whole_whatever_they_hold(fleet: dict, value: str) -> None:
    """Every label value the commands put in a query (job ids, instances, clusters: machine text) is one PromQL string
    literal (gpuwarden.cluster.usage.promql_string): Prometheus's parser gives back exactly the value."""
    from gpuwarden.cluster.accounting_queries import promql_string

    expr = f'label_replace(vector(1), "got", {promql_string(value)}, "", "")'
    body = httpx.get(f"{fleet['url']}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert body["status"] == "success", body
    assert body["data"]["result"][0]["metric"]["got"] == value


@pytest.fixture(scope="module")
def gapped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The fleet's first 90 minutes with the usage records of its last hour missing 20 minutes (the rules backfilled
    before and after, as a rule group that fell behind or a ruler that was down leaves them)."""
    tmp = tmp_path_factory.mktemp("gapped")
    t0 = (int(time.time()) // 3600 - 3) * 3600
    series = Fleet(t0, hours=1.5)
    [group] = [g for g in yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())["groups"]
               if g["name"] == "gpuwarden.usage"]  # fmt: skip
    (tmp / "usage.rules.yml").write_text(yaml.safe_dump({"groups": [group]}))
    at = t0 + 90 * 60 + 7.3
    passes = [(tmp / "usage.rules.yml", t0, at - 40 * 60), (tmp / "usage.rules.yml", at - 20 * 60, at)]
    with backfilled_prometheus(PROMETHEUS, PROMTOOL, tmp, series.openmetrics(), passes) as url:
        yield {"url": url, "at": at, "truth": series.truth(at - 3600, at)}


def test_top_says_which_share_of_its_range_the_records_miss_and_what_it_does(gapped: dict) -> None:
    """A third of the hour's usage group evaluations wrote nothing: top reads the records still (they cover the
    range's start), says in one line and in --json that they miss about a third, and its hours are low by about
    that share; --source raw reads the counters, which lose nothing."""
    flags = ["--prometheus", gapped["url"], "--range", "1h", "--at", str(gapped["at"])]
    ran = subprocess.run([sys.executable, "-m", "gpuwarden", "top", *flags, "--json"], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    doc = yaml.safe_load(ran.stdout)
    assert doc["source"] == "recorded"
    assert doc["records_missing_ratio"] == pytest.approx(1 / 3, abs=0.03)
    [line] = ran.stderr.splitlines()
    assert "the usage records miss 3" in line and "low by about that share" in line and "--source raw" in line
    truth = sum(hours(s, *HELD) for s in gapped["truth"].job_states.values())
    held = sum(j["held_gpu_hours"] for j in doc["jobs"])
    assert held == pytest.approx(truth * (1 - doc["records_missing_ratio"]), rel=0.05)
    raw = cli_json("top", *flags, "--source", "raw")
    assert raw["records_missing_ratio"] is None and raw["records_start"] is None
    assert sum(j["held_gpu_hours"] for j in raw["jobs"]) == pytest.approx(truth, rel=0.01)


def test_top_reads_records_that_begin_late_and_says_from_when(gapped: dict) -> None:
    """A range that starts 30 minutes before the first record (rules loaded after the range began): top reads the
    records still (a fleet's day from the counters would pass its timeout) and says from when they count."""
    ran = subprocess.run([sys.executable, "-m", "gpuwarden", "top", "--prometheus", gapped["url"], "--range", "2h",
                          "--at", str(gapped["at"]), "--json"], capture_output=True, text=True, cwd=REPO, timeout=120,
                         check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    doc = yaml.safe_load(ran.stdout)
    assert doc["source"] == "recorded"
    t0 = gapped["at"] - 90 * 60 - 7.3
    assert t0 <= doc["records_start"] <= t0 + 120
    late, missing = ran.stderr.splitlines()
    begun = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(doc["records_start"]))
    assert f"the usage records begin at {begun}, " in late and "not in the figures" in late
    assert re.search(r", 3[01]m into the last 2h:", late), late  # the range starts 30 min and 7 s before t0
    assert "the usage records miss 2" in missing  # 20 of the 90 minutes since


def test_top_says_nothing_of_records_that_miss_nothing(fleet: dict) -> None:
    ran = subprocess.run([sys.executable, "-m", "gpuwarden", "top", "--prometheus", fleet["url"], "--range", "3h",
                          "--at", str(fleet["at"]), "--json"], capture_output=True, text=True, cwd=REPO, timeout=120,
                         check=False)  # fmt: skip
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    doc = yaml.safe_load(ran.stdout)
    assert doc["source"] == "recorded" and doc["records_missing_ratio"] < 0.01
