"""The command line: config errors, unknown flags, a missing driver, and the demo daemon end to end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx
import pytest
from helpers import free_port
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.cli import main

REPO = Path(__file__).parent.parent


def gw(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def one_line_error(res: subprocess.CompletedProcess) -> str:
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert "Traceback" not in res.stderr
    return lines[-1]


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("poll_interval_seconds: 0\n", "poll_interval_seconds: Input should be greater than or equal to 0.05"),
        ("pol_interval: 1\n", "unknown key 'pol_interval'"),
        ("processes: {max_per_gpu: -1}\n", "processes.max_per_gpu"),
        ("collectors: {disable: [nope]}\n", "unknown collector 'nope'"),
        ("listen_address: nowhere\n", "listen_address: Value error, must be HOST:PORT with a port"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("a: [\n", "invalid YAML"),
    ],
)
@pytest.mark.e2e
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, yaml_text: str, expected: str) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml_text)
    for args in (["check-config", str(cfg)], ["serve", "--config.file", str(cfg), "--demo"]):
        res = gw(*args)
        assert res.returncode == 2, res.stderr
        line = one_line_error(res)
        assert expected in line and line.startswith("gpuwarden: "), line


@pytest.mark.e2e
def test_check_config_prints_effective_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("poll_interval_seconds: 0.5\nprocesses:\n  max_per_gpu: 4\n")
    res = gw("check-config", str(cfg))
    assert res.returncode == 0, res.stderr
    assert "poll_interval_seconds: 0.5" in res.stdout and "max_per_gpu: 4" in res.stdout


def test_flags_override_env_override_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwarden.config import load_config

    cfg = tmp_path / "c.yml"
    cfg.write_text("poll_interval_seconds: 3\nslow_interval_seconds: 20\nlisten_address: 127.0.0.1:1\n")
    monkeypatch.setenv("GPUWARDEN_POLL_INTERVAL_SECONDS", "2")
    monkeypatch.setenv("GPUWARDEN_PROCESSES__MAX_PER_GPU", "3")
    c = load_config(cfg, {"listen_address": "127.0.0.1:2"})
    assert (c.poll_interval_seconds, c.slow_interval_seconds, c.port, c.processes.max_per_gpu) == (2, 20, 2, 3)


@pytest.mark.e2e
def test_unknown_flag_exits_2() -> None:
    res = gw("serve", "--bogus")
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr
    # said by serve in a few lines, not the whole usage: its name, and where its options are
    assert res.stderr.startswith("gpuwarden serve: error:")
    assert "(gpuwarden serve --help for every option)" in res.stderr
    assert len(res.stderr.splitlines()) <= 3


@pytest.mark.parametrize(
    ("argv", "error", "hint"),
    [
        (["top", "--promethus", "http://x"], "the following arguments are required: --prometheus",
         "--promethus: did you mean --prometheus?"),
        (["top", "--prometheus", "http://x", "--rnage", "1h"], "unrecognized arguments: --rnage 1h",
         "--rnage: did you mean --range?"),
        (["tpo"], "invalid choice: 'tpo'", "tpo: did you mean top?"),
    ],
)  # fmt: skip
def test_a_mistyped_flag_or_command_is_named_with_the_one_meant(
    argv: list[str], error: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwarden.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and error in err and f"  {hint}" in err, err
    assert len(err.splitlines()) == 3  # the error, the hint, where every option is


@pytest.mark.e2e
def test_missing_driver_is_one_line_and_exit_1() -> None:
    # This machine (and CI) has no NVIDIA driver: live NVML must fail cleanly, not with a traceback.
    res = gw("serve", "--web.listen-address", "127.0.0.1:0")
    assert res.returncode == 1
    assert one_line_error(res).startswith("gpuwarden: NVML unavailable:")
    assert "'gpuwarden serve --demo' replays a recorded node" in one_line_error(res)  # what to try without a GPU
    res = gw("record", "--duration", "1", "--out", "/tmp/never.jsonl")
    assert res.returncode == 1 and "NVML unavailable" in one_line_error(res)


@pytest.mark.e2e
def test_bad_trace_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    res = gw("serve", "--replay", str(bad), "--web.listen-address", "127.0.0.1:0")
    assert res.returncode == 1 and "the first record must be the header" in one_line_error(res)


@pytest.mark.e2e
def test_address_in_use_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = gw("serve", "--demo", "--web.listen-address", f"127.0.0.1:{port}")
    assert res.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in one_line_error(res)


def test_collectors_command_lists_every_collector(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collectors"]) == 0
    out = capsys.readouterr().out
    for name in ("gpm", "xid", "processes", "exporter"):
        assert name in out


def wait_healthy(proc: subprocess.Popen, base: str, timeout: float = 30) -> None:
    """Wait until the daemon at ``base`` answers /healthz; fail if it exits or does not come up in time."""
    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.time() < deadline and proc.poll() is None, "daemon did not come up"
        time.sleep(0.2)


@pytest.mark.e2e
def test_demo_daemon_serves_metrics_health_and_api() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "serve",
            "--demo",
            "--poll.interval",
            "0.2",
            "--web.listen-address",
            f"127.0.0.1:{port}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base)
        # GPM needs two samples (the first recorded poll has none), and at a poll under 1 s the exposition is
        # re-rendered once a second (gpuwarden.exposition): wait past one refresh
        time.sleep(1.5)
        r = httpx.get(f"{base}/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        # the Date header (written by the server, gpuwarden.web.server.connection, when an answer needs it) is current
        assert abs(parsedate_to_datetime(r.headers["date"]).timestamp() - time.time()) < 5
        assert "date" in httpx.get(f"{base}/no-such-page").headers
        names = {f.name for f in text_string_to_metric_families(r.text)}
        assert {"gpu_utilization_ratio", "gpu_sm_activity_ratio", "gpuwarden_build_info"} <= names
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        api = httpx.get(f"{base}/api/v1/gpus").json()
        assert api["source"] == "replay" and api["gpus"][0]["static"]["name"] == "NVIDIA H100 80GB HBM3"
        assert "/api/v1/gpus" in httpx.get(f"{base}/openapi.json").json()["paths"]
        assert "metrics" in httpx.get(f"{base}/").text
        diag = httpx.get(f"{base}/api/v1/diagnosis")
        assert diag.status_code == 200 and "/api/v1/diagnosis" in httpx.get(f"{base}/openapi.json").json()["paths"]
        # the replay advances: a later scrape has a later poll count
        polls = [
            s.value for f in text_string_to_metric_families(r.text) if f.name == "gpuwarden_polls" for s in f.samples
        ]
        time.sleep(1.5)
        later = [
            s.value
            for f in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)
            if f.name == "gpuwarden_polls"
            for s in f.samples
        ]
        assert later[0] > polls[0]
    finally:
        stopping = time.monotonic()
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert time.monotonic() - stopping < 3  # the sleeping housekeeping loop is woken by the signal


@pytest.mark.e2e
def test_shipped_example_config_is_valid() -> None:
    res = gw("check-config", str(REPO / "deploy" / "gpuwarden.example.yml"))
    assert res.returncode == 0, res.stderr
    assert "listen_address: 0.0.0.0:10400" in res.stdout


@pytest.mark.e2e
def test_bad_web_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: not-a-bcrypt-hash\n")
    res = gw("serve", "--demo", "--web.config.file", str(web), "--web.listen-address", "127.0.0.1:0")
    assert res.returncode == 2
    line = one_line_error(res)
    assert line.startswith("gpuwarden: ") and str(web) in line and "not-a-bcrypt-hash" not in line


@pytest.mark.e2e
def test_served_with_basic_auth_from_the_web_config_flag(tmp_path: Path) -> None:
    import bcrypt

    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden", "serve", "--demo", "--web.config.file", str(web),
                             "--web.listen-address", f"127.0.0.1:{port}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base)
        denied = httpx.get(f"{base}/metrics")
        assert denied.status_code == 401 and "date" in denied.headers
        assert httpx.get(f"{base}/metrics", auth=("prometheus", "wrong")).status_code == 401
        assert httpx.get(f"{base}/metrics", auth=("prometheus", "s3cret")).status_code == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert "s3cret" not in out + err and hashed not in out + err


def test_the_demo_listens_on_loopback_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo is for a look on this machine: 127.0.0.1 unless --web.listen-address (or the config or environment)
    names an address; a node's daemon keeps listening on every interface."""
    from gpuwarden.config import load_config

    monkeypatch.delenv("GPUWARDEN_LISTEN_ADDRESS", raising=False)
    assert load_config(None, {"demo": True}).listen_address == "127.0.0.1:10400"
    assert load_config(None, {"demo": True, "listen_address": "0.0.0.0:9"}).listen_address == "0.0.0.0:9"
    monkeypatch.setenv("GPUWARDEN_LISTEN_ADDRESS", "10.0.0.1:10400")
    assert load_config(None, {"demo": True}).listen_address == "10.0.0.1:10400"
    monkeypatch.delenv("GPUWARDEN_LISTEN_ADDRESS")
    assert load_config(None, {}).listen_address == "0.0.0.0:10400"


def test_the_demo_scene_from_the_flag_the_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:  # fmt: skip
    """``--demo`` alone and the key's older ``true`` are the workloads demo; ``--demo faults`` and ``demo: faults``
    the faults one; anything else is refused in one line before a trace is read."""
    from gpuwarden.cli import build_parser
    from gpuwarden.commands.serve import overrides
    from gpuwarden.config import ConfigError, load_config

    parse = build_parser().parse_args
    assert overrides(parse(["serve", "--demo"]))["demo"] == "workloads"
    assert overrides(parse(["serve", "--demo", "faults", "--log.level", "debug"]))["demo"] == "faults"
    assert load_config(None, {"demo": True}).demo == "workloads" and load_config(None, {"demo": False}).demo is None
    cfg = tmp_path / "c.yml"
    cfg.write_text("demo: faults\n")
    assert load_config(cfg, {}).demo == "faults"
    monkeypatch.setenv("GPUWARDEN_DEMO", "1")
    assert load_config(None, {}).demo == "workloads"
    monkeypatch.delenv("GPUWARDEN_DEMO")
    cfg.write_text("demo: chaos\n")
    with pytest.raises(ConfigError, match="demo"):
        load_config(cfg, {})
    res = subprocess.run([sys.executable, "-m", "gpuwarden", "serve", "--demo", "chaos"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert res.returncode == 2 and "invalid choice: 'chaos' (choose from 'workloads', 'faults')" in res.stderr


def test_every_subcommand_has_a_description_and_every_argument_its_help() -> None:
    import argparse

    from gpuwarden.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    listed = {c.dest: c.help for c in sub._choices_actions}  # noqa: SLF001
    for name, command in sub.choices.items():
        assert listed.get(name) and command.description, name
        bare = [a.option_strings or a.dest for a in command._actions if not a.help]  # noqa: SLF001
        assert bare == [], (name, bare)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["top", "--prometheus", "http://127.0.0.1:9", "--prometheus.ca-file", "/nonexistent/ca.pem"],
         "cannot load --prometheus.ca-file /nonexistent/ca.pem: No such file or directory"),
        (["top", "--prometheus", "http://127.0.0.1:9", "--prometheus.bearer-token-file", "/nonexistent/token"],
         "cannot read the bearer token file /nonexistent/token: No such file or directory"),
        (["diagnose", "--url", "http://127.0.0.1:9", "--url.username", "u", "--url.password-file", "/nonexistent/pw"],
         "cannot read --url.password-file /nonexistent/pw: No such file or directory"),
        (["mixin", "--out", "/nonexistent-dir-for-a-test", "--params", "/nonexistent/params.yml"],
         "/nonexistent/params.yml: No such file or directory"),
    ],
)  # fmt: skip
def test_a_file_that_cannot_be_read_is_said_in_words(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwarden.cli import main

    assert main(argv) in (1, 2)
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert "Errno" not in err and "Error" not in err.split(":", 1)[1], err  # no errno, no exception class
