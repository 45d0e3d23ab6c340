"""One log, in logfmt or JSON, for the daemon and uvicorn, with structured fields."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time

import httpx
import pytest

from gpuwarden.logs import JsonFormatter, LogfmtFormatter, setup


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "gpuwarden.test", "levelname": "WARNING", "msg": msg})
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
def test_daemon_and_uvicorn_log_in_one_json_format() -> None:
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
    assert "gpuwarden" in loggers and "uvicorn.error" in loggers
    serving = next(obj for obj in lines if obj["msg"] == "serving")
    assert serving["gpus"] == 1 and serving["url"].endswith(f":{port}/metrics")
