"""Every input path is bounded: special files, oversized files, deep nesting, unknown environment variables, bad
host names and an insight window too long for the poll interval get one line, or a bound and a warning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.config import MAX_CONFIG_BYTES, Config, ConfigError, load_config
from gpuwarden.trace import TraceError, read_trace


def gw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, **(env or {})},
    )


def _one_line(res: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert res.returncode == code and text in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.e2e
def test_special_files_are_refused_not_read(fifo: Path) -> None:
    for path in (fifo, Path("/dev/zero")):
        _one_line(gw("check-config", str(path)), 2, "not a regular file")
        _one_line(gw("diagnose", "--replay", str(path)), 1, "not a regular file")
        with pytest.raises(TraceError, match="not a regular file"):
            read_trace(path)


@pytest.mark.e2e
def test_missing_and_oversized_config_files(tmp_path: Path) -> None:
    _one_line(gw("check-config", str(tmp_path / "nope.yml")), 2, "cannot read")
    big = tmp_path / "big.yml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    _one_line(gw("check-config", str(big)), 2, f"larger than {MAX_CONFIG_BYTES} bytes")
    web = tmp_path / "c.yml"
    web.write_text(f"web_config_file: {big}\n")
    _one_line(gw("check-config", str(web)), 2, "larger than")


@pytest.mark.e2e
def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"type":"header","x":' + "[" * 100000 + "]" * 100000 + "}\n")
    _one_line(gw("diagnose", "--replay", str(deep)), 1, "nested too deeply")
    yml = tmp_path / "deep.yml"
    yml.write_text("gpus: " + "[" * 50000 + "]" * 50000 + "\n")
    _one_line(gw("check-config", str(yml)), 2, "")
    res = gw("check-config", str(tmp_path / "deep.jsonl"), env={"GPUWARDEN_COLLECTORS": "[" * 20000 + "]" * 20000})
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_long_trace_line_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwarden import trace

    monkeypatch.setattr(trace, "MAX_LINE_CHARS", 1000)
    path = tmp_path / "t.jsonl"
    path.write_text('{"type":"header","x":"' + "a" * 5000 + '"}\n')
    with pytest.raises(TraceError, match="line 1: longer than 1000 characters"):
        read_trace(path)


def test_unknown_environment_variables_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("GPUWARDEN_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUWARDEN_POL_INTERVAL_SECONDS", "3")
    with pytest.raises(ConfigError, match="unknown environment variable GPUWARDEN_POL_INTERVAL_SECONDS"):
        load_config(None)
    monkeypatch.delenv("GPUWARDEN_POL_INTERVAL_SECONDS")
    monkeypatch.setenv("GPUWARDEN_PROCESSES__MAX_PER_GPU", "3")
    assert load_config(None).processes.max_per_gpu == 3
    monkeypatch.setenv("GPUWARDEN_ARGS", "--web.config.file /etc/gpuwarden/web-config.yml")  # the unit's flags
    for link in (
        "GPUWARDEN_SERVICE_HOST",
        "GPUWARDEN_SERVICE_PORT",
        "GPUWARDEN_SERVICE_PORT_METRICS",
        "GPUWARDEN_PORT",
        "GPUWARDEN_PORT_10400_TCP",
        "GPUWARDEN_PORT_10400_TCP_ADDR",
    ):
        monkeypatch.setenv(link, "10.0.0.1")  # what Kubernetes sets for a Service named gpuwarden
    assert load_config(None).processes.max_per_gpu == 3
    monkeypatch.setenv("GPUWARDEN_PROCESSES__NOPE", "3")
    with pytest.raises(ConfigError, match="no configuration key processes.nope"):
        load_config(None)


@pytest.mark.e2e
def test_a_host_name_label_over_63_characters_is_one_line() -> None:
    _one_line(gw("serve", "--demo", "--web.listen-address", "a" * 70 + ":10400"), 1, "not a valid host name")


def test_an_insight_window_too_long_for_the_poll_is_bounded_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    from gpuwarden.daemon import MAX_WINDOW_POLLS, build_analyzers

    cfg = Config(poll_interval_seconds=0.05, insight={"window_seconds": 86400})  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        analyzers = build_analyzers(cfg)
    assert "the window is" in caplog.text
    analyzer = analyzers["insight"].__self__  # type: ignore[attr-defined]
    assert analyzer.window_seconds == pytest.approx(MAX_WINDOW_POLLS * 0.05)


@pytest.mark.e2e
def test_check_config_refuses_what_serve_would(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"replay: {tmp_path / 'missing.jsonl'}\n")
    _one_line(gw("check-config", str(cfg)), 2, "replay:")
    cfg.write_text("gpus: [0, -1]\n")
    _one_line(gw("check-config", str(cfg)), 2, "GPU indices are 0 or more")
    _one_line(gw("serve", "--demo", "--gpus", "0"), 2, "cannot apply to a replay or the demo")


@pytest.mark.e2e
def test_version_says_the_runtime() -> None:
    res = gw("--version")
    assert res.returncode == 0
    for part in ("gpuwarden ", "python: ", "nvidia-ml-py: ", "prometheus-client: ", "NVIDIA driver: "):
        assert part in res.stdout, res.stdout


@pytest.mark.e2e
def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("poll_interval_seconds: 2\n")
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "check-config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        proc.stdout.close()  # the reader goes away before the output is written
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 and b"Traceback" not in err, err
