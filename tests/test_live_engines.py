"""``top`` over the same live daemon on Prometheus and VictoriaMetrics, both scraping it every second, across scrapes
that failed: the daemon (replaying an 8-GPU recording, tests/data/traces/derived-8gpu.jsonl.gz) is stopped
(SIGSTOP) until both engines have marked it down, then continued. A failed scrape writes staleness markers in
Prometheus, and VictoriaMetrics looks back about a scrape interval: an instant selector then found no earlier value
of a counter, and its whole value counted as growth. Each GPU's held and busy hours are held to what that engine's
own raw samples of the counters grew over the range (the daemon starts within it: the counters' first values count).
On the accounting before its look backs were written out, Prometheus read 70.4 s held of a GPU in this 60 s range
whose counters grew 45.4 s."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import yaml
from helpers import REPO, cli_json, free_port, prometheus, served, stop_all, wait_http
from slurm_node import wait_for

VICTORIA = shutil.which("victoria-metrics")
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(VICTORIA is None or PROMETHEUS is None, reason="victoria-metrics / prometheus not installed"),
]
TRACE = REPO / "tests" / "data" / "traces" / "derived-8gpu.jsonl.gz"
#: The range asked, in seconds: it holds the failed scrapes and a stretch of good ones on either side.
RANGE_S = 60


def _query(url: str, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    body = httpx.get(f"{url}/api/v1/query", params=params, timeout=30).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def _count(url: str, expr: str) -> float:
    """The one value of ``expr`` (0 where it has none)."""
    found = _query(url, expr)
    return float(found[0]["value"][1]) if found else 0.0


def _at_least(url: str, expr: str, n: float) -> Callable[[], bool]:
    """A check that the one value of ``expr`` at ``url`` is ``n`` or more."""
    return lambda: _count(url, expr) >= n


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("live")
    port = free_port()
    target = f"127.0.0.1:{port}"
    scrape = {"job_name": "gpuwarden", "scrape_interval": "1s", "scrape_timeout": "500ms",
              "static_configs": [{"targets": [target]}]}  # fmt: skip
    (tmp / "vm.yml").write_text(yaml.safe_dump({"scrape_configs": [scrape]}))
    procs: list[subprocess.Popen] = []
    try:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "serve", "--replay", str(TRACE), "--web.listen-address", target,
             "--log.level", "warning"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "GPUWARDEN_NODE_NAME": "live"})  # fmt: skip
        procs.append(daemon)
        assert VICTORIA is not None
        vm_server, vm = served(lambda vm_port: [
            VICTORIA, f"-storageDataPath={tmp / 'vm'}", f"-httpListenAddr=127.0.0.1:{vm_port}",
            f"-promscrape.config={tmp / 'vm.yml'}", "-loggerLevel=ERROR",
            "-search.latencyOffset=0s"], "/health")  # by default it shows no sample younger than 30 s  # fmt: skip
        procs.append(vm_server)
        server, prom = prometheus(PROMETHEUS, tmp, {"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape]})
        procs.append(server)
        wait_http(f"http://{target}/healthz", proc=daemon)
        wait_http(f"{prom}/-/ready", proc=server)
        urls = {"prometheus": prom, "victoriametrics": vm}
        # a stretch of good scrapes, then failed ones (the daemon stopped), then good ones again
        good = 'sum(sum_over_time(up{job="gpuwarden"}[20s]))'
        failed = 'sum(count_over_time(up{job="gpuwarden"}[20s]) - sum_over_time(up{job="gpuwarden"}[20s]))'
        for url in urls.values():
            wait_for(f"15 good scrapes in {url}", _at_least(url, good, 15))
        daemon.send_signal(signal.SIGSTOP)
        try:
            for url in urls.values():
                wait_for(f"3 failed scrapes in {url}", _at_least(url, failed, 3))
            stopped = time.time()
        finally:
            daemon.send_signal(signal.SIGCONT)
        for url in urls.values():
            wait_for(f"{url} to scrape the daemon again", _at_least(url, 'sum(up{job="gpuwarden"})', 1))
        back = time.time()
        after = 'sum(sum_over_time(up{job="gpuwarden"}[15s]))'
        for url in urls.values():
            wait_for(f"15 good scrapes after in {url}", _at_least(url, after, 15))
        httpx.get(f"{vm}/internal/force_flush", timeout=60).raise_for_status()
        yield {**urls, "at": time.time() - 5, "down": (stopped, back)}
    finally:
        stop_all(procs)


def _grown(url: str, metric: str, at: float, states: set[str]) -> dict[str, float]:
    """Per GPU, what the engine's raw samples of ``metric`` (of ``states``) grew by in (at - RANGE_S, at]: each sample
    less the one before it, or its value where the counter restarted or began (the daemon starts within the
    range, and a state's series begins once its counter grew)."""
    out: dict[str, float] = {}
    for series in _query(url, f"{metric}[{RANGE_S + 300}s]", at):
        if series["metric"].get("state") not in states:
            continue
        # a staleness marker reads NaN in VictoriaMetrics' raw samples: a failed scrape, not a reading
        points = [(float(t), float(v)) for t, v in series["values"] if not math.isnan(float(v))]
        pairs = zip(points, points[1:], strict=False)
        grew = sum(now - before if now >= before else now for (_, before), (t, now) in pairs if at - RANGE_S < t <= at)
        if points and at - RANGE_S < points[0][0] <= at:  # the series began in the range: its first value grew there
            grew += points[0][1]
        gpu = series["metric"]["gpu"]
        out[gpu] = out.get(gpu, 0.0) + grew
    return out


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_top_over_failed_scrapes_is_what_the_counters_grew(engines: dict, engine: str) -> None:
    at = engines["at"]
    assert at - RANGE_S < engines["down"][0] < engines["down"][1] < at  # the failed scrapes are inside the range
    doc = cli_json("top", "--prometheus", engines[engine], "--range", f"{RANGE_S}s", "--step", "1s", "--resolution",
                   "1s", "--at", f"{at:.3f}", "--source", "raw")  # fmt: skip
    from gpuwarden.insight.vocabulary.states import STATES

    held = _grown(engines[engine], "gpu_state_seconds_total", at, set(STATES) - {"free"})
    busy = _grown(engines[engine], "gpu_state_seconds_total", at, {"busy"})
    gpus = {g["gpu"]: g for g in doc["gpus"]}
    assert set(gpus) == set(held) and len(gpus) == 8
    for gpu, seconds in held.items():
        assert seconds > 0.5 * RANGE_S, (gpu, seconds)  # the recording's GPUs are held
        assert gpus[gpu]["held_gpu_hours"] * 3600 == pytest.approx(seconds, rel=0.01, abs=0.01), gpu
        assert gpus[gpu]["busy_gpu_hours"] * 3600 == pytest.approx(busy.get(gpu, 0.0), rel=0.01, abs=0.01), gpu
        assert gpus[gpu]["held_gpu_hours"] * 3600 <= RANGE_S + 1e-6  # never more than the range
