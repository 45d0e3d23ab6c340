"""``gpuwarden diagnose`` views: the one-line-per-GPU table first, ``--brief`` on one screen, ``--url`` against a real
daemon, ``--watch``, and the errors of flags that cannot apply."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import trace
from helpers import REPO, daemon, free_port, stop, wait_http

pytestmark = pytest.mark.e2e  # every test here starts a process or an outside tool


ENV = {**os.environ, "COLUMNS": "120", "LINES": "50", "TERM": "dumb"}


def _diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "diagnose", *args],
        capture_output=True, text=True, timeout=60, env=ENV, cwd=REPO,
    )  # fmt: skip


def test_brief_on_8_gpus_fits_one_screen_names_every_verdict_one_line_a_gpu() -> None:
    out = _diagnose("--replay", str(trace("derived-8gpu")), "--brief")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= 40, len(lines)  # a 120 x 50 terminal, with room for the prompt
    rows = [ln for ln in lines if ln.startswith("│") and ln.split("│")[1].strip().isdigit()]
    assert [int(r.split("│")[1]) for r in rows] == list(range(8))
    assert all(("waiting on peers" in r) or ("input starved" in r) for r in rows)
    # one line a GPU: the table's body is its 8 rows, no continuation lines (the remedy cut with an ellipsis)
    body = [ln for ln in lines if ln.startswith("│")]
    assert len(body) == 8, body
    assert "what to do first" in out.stdout and "evidence" not in out.stdout


def test_the_full_report_starts_with_the_table_then_the_details() -> None:
    out = _diagnose("--replay", str(trace("h100-starved_dataloader")))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.index("what to do first") < text.index("evidence") < text.index("what to do:")
    assert "94%" in text and "input starved at >= 25%" in text  # ratios and their rules both in percent


def test_url_shows_the_running_daemons_diagnosis() -> None:
    with daemon("--replay", str(trace("derived-8gpu"))) as url:
        deadline = time.monotonic() + 30
        while True:
            doc = httpx.get(url + "/api/v1/diagnosis").json()
            if doc["gpus"] and all(g["diagnosis"] for g in doc["gpus"]):
                break
            assert time.monotonic() < deadline
            time.sleep(0.3)
        out = _diagnose("--url", url, "--json")
        brief = _diagnose("--url", url.removeprefix("http://"), "--brief")
    assert out.returncode == 0, out.stderr
    import json

    report = json.loads(out.stdout)
    assert report["source"] == f"daemon at {url}" and report["polls"] is None
    assert [g["gpu"] for g in report["diagnosis"]["gpus"]] == [g["gpu"] for g in doc["gpus"]]
    assert report["diagnosis"]["window_seconds"] == doc["window_seconds"] == 300
    assert brief.returncode == 0 and "daemon at http://127.0.0.1" in brief.stdout and "what to do first" in brief.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--url", f"http://127.0.0.1:{free_port()}"], 1, "cannot reach http://127.0.0.1:"),
        (["--url", "http://[::1"], 1, "cannot reach"),
        (["--replay", "x.jsonl", "--url", "http://h:1"], 2, "--replay and --url cannot apply together"),
        (["--replay", "x.jsonl", "--watch"], 2, "--watch redraws a live view"),
        (["--watch", "--json"], 2, "--watch redraws a live view"),
        (["--interval", "0"], 2, "must be positive"),
    ],
)
def test_flags_that_cannot_apply_are_one_line(args: list[str], code: int, message: str) -> None:
    out = _diagnose(*args)
    assert out.returncode == code and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_url_that_is_not_a_gpuwarden_is_one_line() -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from threading import Thread

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            code = 404 if "nothere" in self.path else 200
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b'{"hello": "world"}')

        def log_message(self, *args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Other)
    Thread(target=srv.serve_forever, daemon=True).start()
    try:
        wrong = _diagnose("--url", f"http://127.0.0.1:{srv.server_port}")
        missing = _diagnose("--url", f"http://127.0.0.1:{srv.server_port}/nothere")
    finally:
        srv.shutdown()
    assert wrong.returncode == 1 and "did not answer a diagnosis document" in wrong.stderr
    assert missing.returncode == 1 and "not found (404)" in missing.stderr


def test_watch_redraws_until_interrupted() -> None:
    with daemon("--replay", str(trace("derived-8gpu"))) as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "diagnose", "--url", url, "--watch", "--brief", "--interval", "0.3"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO,
        )  # fmt: skip
        # into a pipe: each redraw is printed as it comes, under its time (nothing waits for the interrupt)
        assert proc.stdout is not None
        watchdog = threading.Timer(60, proc.send_signal, [signal.SIGINT])  # a watch that never prints still ends
        watchdog.start()
        seen: list[str] = []
        while sum(line.startswith("--- ") for line in seen) < 3 and len(seen) < 2000:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
        watchdog.cancel()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert sum(line.startswith("--- ") for line in seen) == 3 and seen[0].startswith("--- "), seen[:5]
    assert "what to do first" in "".join(seen) and "Traceback" not in err


@pytest.mark.e2e
def test_watch_survives_a_daemon_restart(tmp_path: Path) -> None:
    """The daemon goes away and comes back on its port: --watch says it cannot reach it, then draws again."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "serve", "--replay", str(trace("derived-8gpu")),
             "--web.listen-address", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
        )  # fmt: skip
        wait_http(url + "/healthz", proc=proc)
        return proc

    out_file = tmp_path / "watch.out"
    first = start()
    with open(out_file, "w") as out:
        watch = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "diagnose", "--url", url, "--watch", "--interval", "0.3"],
            stdout=out, stderr=subprocess.STDOUT, text=True, env={**ENV, "FORCE_COLOR": "1", "TERM": "xterm"}, cwd=REPO,
        )  # fmt: skip
    second = None
    try:
        _wait_for(out_file, "GPU", watch)
        stop(first)
        _wait_for(out_file, "cannot reach", watch)
        seen = len(out_file.read_text())
        second = start()
        deadline = time.monotonic() + 30
        while "what to do" not in out_file.read_text()[seen:]:  # drawn again from the new daemon
            assert watch.poll() is None and time.monotonic() < deadline, out_file.read_text()[-2000:]
            time.sleep(0.2)
        watch.send_signal(signal.SIGINT)
        assert watch.wait(20) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
        stop(first)
        if second is not None:
            stop(second)
    assert "Traceback" not in out_file.read_text()


def _wait_for(path: Path, text: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while text not in path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()[-2000:]
        time.sleep(0.1)


@pytest.mark.parametrize(("height", "shows"), [(400, "what to do:"), (50, "what to do first:")])
def test_watch_draws_what_fits_the_terminal(height: int, shows: str) -> None:
    """A tall terminal gets the whole report; a short one the summary and each GPU's first remedy, within its
    height."""
    from rich.console import Console

    from gpuwarden.commands.diagnose import _fit, replay_report

    report = replay_report(trace("derived-8gpu"))
    console = Console(width=120, height=height, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(_fit(console, report, None, brief=False))
    text = cap.get()
    assert shows in text and len(text.splitlines()) < height


@pytest.mark.e2e
def test_url_credentials_come_from_a_file_and_a_wrong_password_is_said(tmp_path: Path) -> None:
    """diagnose --url against a daemon behind basic auth: the password from --url.password-file (never on the command
    line), a wrong one said as such, none asked for by name; exit 1 with one line each time it is refused."""
    import bcrypt

    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  ops: '{bcrypt.hashpw(b'right', bcrypt.gensalt(4)).decode()}'\n")
    (tmp_path / "right").write_text("right\n")
    (tmp_path / "wrong").write_text("wrong\n")

    def ask(url: str, *more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuwarden", "diagnose", "--url", url, "--brief", *more],
                              capture_output=True, text=True, env=ENV, cwd=REPO, timeout=60, check=False)  # fmt: skip

    with daemon("--replay", str(trace("derived-8gpu")), "--web.config.file", str(web)) as url:
        good = ask(url, "--url.username", "ops", "--url.password-file", str(tmp_path / "right"))
        bad = ask(url, "--url.username", "ops", "--url.password-file", str(tmp_path / "wrong"))
        in_url = ask(url.replace("http://", "http://ops:guess-7f3@"))
        none = ask(url)
    assert good.returncode == 0 and "GPU" in good.stdout, good.stderr
    assert bad.returncode == 1 and "refused the credentials given (401)" in bad.stderr
    assert (
        in_url.returncode == 1 and "refused the credentials given" in in_url.stderr and "guess-7f3" not in in_url.stderr
    )
    assert none.returncode == 1 and "wants credentials (401): --url.username" in none.stderr
    assert all(r.stderr.count("\n") == 1 for r in (bad, in_url, none))
    half = ask("http://127.0.0.1:1", "--url.username", "ops")
    assert half.returncode == 2 and "go together" in half.stderr
