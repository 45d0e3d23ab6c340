"""One log, in logfmt or JSON, for the daemon and its HTTP server, with structured fields."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpuwarden.logs import JsonFormatter, LogfmtFormatter, RateLimitFilter, setup


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord(
        {"name": "gpuwarden.test", "levelname": "WARNING", "levelno": logging.WARNING, "msg": msg}
    )
    record.__dict__.update(extra)
    return record


def test_logfmt_quotes_what_needs_it_and_keeps_fields() -> None:
    line = LogfmtFormatter().format(_record('GPU "lost" now', gpu=1, call="nvmlDeviceGetPowerUsage"))
    assert 'msg="GPU \\"lost\\" now"' in line and "gpu=1" in line and "call=nvmlDeviceGetPowerUsage" in line
    assert line.startswith("ts=") and " level=warning " in line and "\n" not in line


def test_json_lines_parse() -> None:
    obj = json.loads(JsonFormatter().format(_record("x", gpu=0, error="gpu_is_lost")))
    assert obj["msg"] == "x" and obj["gpu"] == 0 and obj["error"] == "gpu_is_lost" and obj["level"] == "warning"


def test_setup_refuses_unknown_levels_and_formats() -> None:
    with pytest.raises(ValueError, match="log level must be one of"):
        setup("loud")
    with pytest.raises(ValueError):
        setup("info", "xml")


@pytest.mark.e2e
def test_daemon_and_its_server_log_in_one_json_format() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "serve",
            "--demo",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--log.format",
            "json",
            "--log.level",
            "info",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    loggers = {obj["logger"] for obj in lines}
    assert {"gpuwarden", "gpuwarden.web"} <= loggers
    messages = [obj["msg"] for obj in lines]
    assert messages.index("shutting down") < messages.index("stopped")
    serving = next(obj for obj in lines if obj["msg"] == "serving")
    assert serving["gpus"] == 1 and serving["url"].endswith(f":{port}/metrics")


def test_rate_limit_lets_a_burst_through_then_says_how_many_it_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("gpuwarden.logs.time.monotonic", lambda: now[0])
    limit = RateLimitFilter(burst=5, period=10.0)
    passed = [r for r in (_record(f"r{i}") for i in range(50)) if limit.filter(r)]
    assert [r.msg for r in passed] == ["r0", "r1", "r2", "r3", "r4"]
    now[0] += 10.0  # the next period
    nxt = _record("after")
    assert limit.filter(nxt) and nxt.getMessage() == "after (45 similar messages dropped in the last 10 s)"


@pytest.mark.e2e
def test_access_lines_only_at_debug_after_reloads_and_bounded_in_a_flood(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("log_level: info\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "serve", "--demo", "--config.file", str(cfg)]
            + ["--web.listen-address", f"127.0.0.1:{port}", "--log.format", "json"],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )

    def wait_for(text: str, count: int) -> None:
        deadline = time.monotonic() + 30
        while log.read_text().count(text) < count:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)

    def flood(n: int) -> float:
        start = time.monotonic()
        with httpx.Client(timeout=5) as c:
            for _ in range(n):
                assert c.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        return time.monotonic() - start

    def access_lines() -> list[dict[str, object]]:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        return [obj for obj in lines if obj["logger"] == "gpuwarden.access"]

    try:
        wait_for('"msg": "serving"', 1)
        proc.send_signal(signal.SIGHUP)  # the same level: access lines stay off
        wait_for("configuration reloaded", 1)
        flood(300)
        assert access_lines() == []
        cfg.write_text("log_level: debug\n")
        proc.send_signal(signal.SIGHUP)
        wait_for("configuration reloaded", 2)
        took = flood(600)
    finally:
        proc.terminate()
        proc.wait(10)
    lines = access_lines()
    assert 100 <= len(lines) <= 100 * (1 + took // 10)  # at most 100 in each 10 s


def test_rate_limit_passes_records_below_its_level() -> None:
    limit = RateLimitFilter(burst=1, period=60.0, level=logging.WARNING)
    info = [logging.makeLogRecord({"levelno": logging.INFO, "msg": f"i{i}"}) for i in range(10)]
    assert all(limit.filter(r) for r in info)  # "shutting down" and friends are never dropped
    assert limit.filter(_record("w0")) and not limit.filter(_record("w1"))
