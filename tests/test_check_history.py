"""``gpuwarden check --prometheus``: a GPU's history joins the NVML read. Against a real Prometheus holding an hour of
series (backfilled with promtool; written here, not readings): the recorded idle H100 (h100-idle, whose NVML read is
PASS) went off the bus for a minute 40 minutes ago, so its history puts it in service: CRITICAL, exit 2, with the
reason. Another node's GPU with the same troubles does not count. Prometheus unreachable: the NVML read alone, one
line on stderr."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, backfilled_prometheus

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool not installed"),
]
TRACE = REPO / "tests" / "data" / "traces" / "h100-idle.jsonl.gz"
UUID = "GPU-b554abb3-fd44-fc47-d779-461942899d0b"  # the trace's GPU


def _series(end: int) -> str:
    lines = []
    for uuid, inst in ((UUID, "node-a:10400"), ("GPU-other", "node-b:10400")):
        labels = f'instance="{inst}",job="gpuwarden",gpu="0",uuid="{uuid}"'
        up = [(t, 0 if end - 2400 <= t < end - 2340 else 1) for t in range(end - 3600, end + 1, 15)]
        lines += [f"gpu_up{{{labels}}} {v} {t}" for t, v in up]
    return "\n".join([*sorted(lines, key=lambda x: x.split(" ")[0]), "# EOF", ""])


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    end = int(time.time()) - 60
    assert PROMETHEUS and PROMTOOL
    with backfilled_prometheus(PROMETHEUS, PROMTOOL, tmp_path_factory.mktemp("history"), _series(end)) as url:
        yield url


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--replay", str(TRACE), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)  # fmt: skip


def test_without_history_the_idle_gpu_passes() -> None:
    res = check("--format", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["level"] == "PASS"


def test_a_gpu_that_went_off_the_bus_this_hour_is_critical_with_its_history(prom: str) -> None:
    res = check("--format", "json", "--prometheus", prom, "--range", "1h")
    assert res.returncode == 2, res.stderr
    doc = json.loads(res.stdout)
    [gpu] = doc["gpus"]
    assert gpu["uuid"] == UUID and gpu["level"] == "CRITICAL"
    [finding] = gpu["findings"]
    assert finding["reason"].startswith("history, last 1h: A GPU cannot be read") and "serviced" in finding["action"]
    # 30 minutes back: the minute off the bus is outside the range
    assert check("--prometheus", prom, "--range", "30m").returncode == 0


def test_an_unreachable_prometheus_leaves_the_nvml_read_and_says_so_in_one_line(tmp_path: Path) -> None:
    res = check("--prometheus", "http://127.0.0.1:9", "--timeout", "2")
    assert res.returncode == 0
    assert res.stderr.count("\n") == 1 and "no history from http://127.0.0.1:9" in res.stderr
