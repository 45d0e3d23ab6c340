"""Helpers for tests that run the real daemon as a process: a free port, waiting for HTTP, a daemon context."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


#: Ports handed out in this test run: the kernel may hand a closed port out again at once, and two daemons told
#: the same port leave one scrape target answering for two (every join on their labels then fails).
_GIVEN: set[int] = set()


def cli_json(*args: str) -> dict:
    """``gpuwarden ARGS --json`` run from the checkout: its document. Fails the test, with its standard error, when
    it exits non-zero."""
    import json

    res = subprocess.run([sys.executable, "-m", "gpuwarden", *args, "--json"], capture_output=True, text=True,
                         cwd=REPO, timeout=300, check=False, env={**os.environ, "COLUMNS": "160"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that no earlier call in this run returned."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def wait_http(url: str, timeout: float = 30, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``url`` answers below 500; AssertionError after ``timeout`` s or when ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process serving {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout} s")


def served(command: Callable[[int], list[str]], ready_path: str, tries: int = 3) -> tuple[subprocess.Popen, str]:
    """Start the server ``command(port)`` on a free port and wait until ``ready_path`` answers; returns the process and
    its URL. A port free when chosen may be taken before the server binds it (another process's outgoing connection
    or listener: the same ephemeral range), so a server that exits saying its address is in use is started again on
    another port, up to ``tries`` times. AssertionError with the server's last words otherwise."""
    for _ in range(tries):
        port = free_port()
        proc = subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}{ready_path}", proc=proc)
        except AssertionError:
            stop_all([proc])
            said = proc.stderr.read() if proc.stderr is not None else ""
            if "address already in use" in said:
                continue
            raise AssertionError(f"{command(port)[0]} on {url} did not start: {said[-500:]}") from None
        assert proc.stderr is not None
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # drained: a full pipe would block it
        return proc, url
    raise AssertionError(f"{command(0)[0]}: every port tried was taken before it could bind it")


def count_closed(sockets: list[socket.socket], timeout: float) -> int:
    """How many of ``sockets`` the server has closed (EOF or reset within ``timeout`` s each); closes them all."""
    closed = 0
    for s in sockets:
        s.settimeout(timeout)
        try:
            closed += s.recv(1) == b""
        except ConnectionResetError:
            closed += 1
        except TimeoutError:
            pass  # still open
        s.close()
    return closed


@contextmanager
def daemon(*args: str, log: Path | None = None) -> Iterator[str]:
    """Run ``gpuwarden serve ARGS`` on a free port of 127.0.0.1 until the block ends; yield its base URL."""
    port = free_port()
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "serve", "--web.listen-address", f"127.0.0.1:{port}", *args],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", proc=proc)
        yield url
    finally:
        stop(proc)
        if log is not None:
            out.close()  # type: ignore[union-attr]


@contextmanager
def serving(*args: str, log: Path, **popen: Any) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run ``gpuwarden serve --demo ARGS`` on a free port of 127.0.0.1, its output in ``log``, until the block ends;
    yield the process and its port once the log says "serving" (HTTP or HTTPS alike). ``popen``: more keyword
    arguments of subprocess.Popen (``preexec_fn``, ``env``)."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "serve", "--demo", "--web.listen-address", f"127.0.0.1:{port}", *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            **popen,
        )
    try:
        deadline = time.monotonic() + 30
        while "serving" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        yield proc, port
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``proc`` and wait for it; SIGKILL it after 10 s."""
    stop_all([proc])


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process of ``procs`` at once, then wait for each; SIGKILL one still running after 10 s."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def skip_where_nvml_works(what: str) -> None:
    """Skip the calling test (``what`` cannot be shown) on a machine whose NVML initialises: a real driver."""
    import pynvml
    import pytest

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return
    pynvml.nvmlShutdown()
    pytest.skip(f"this machine has NVML: {what} cannot be shown here")


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def replay_nodes(
    traces: dict[str, str], env: dict[str, dict[str, str]], args: tuple[str, ...] = ()
) -> tuple[list[subprocess.Popen], dict[str, int]]:
    """Start one ``serve --replay`` daemon per node of ``traces`` (node -> trace name in tests/data/traces), each on a
    free port with its ``env`` added (node -> variables) and ``args`` (flags); returns the processes and each node's
    port."""
    ports = {n: free_port() for n in traces}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                "serve",
                "--replay",
                str(REPO / "tests" / "data" / "traces" / f"{trace}.jsonl.gz"),
                "--web.listen-address",
                f"127.0.0.1:{ports[n]}",
                "--log.level",
                "warning",
                *args,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **env.get(n, {})},
        )  # fmt: skip
        for n, trace in traces.items()
    ]
    return procs, ports


@contextmanager
def alertmanager(binary: str, tmp: Path, config: dict[str, Any]) -> Iterator[str]:
    """Run a real Alertmanager (``binary``) with ``config`` (written to ``tmp``/am.yml), its storage in ``tmp``,
    clustering off, for the block: yields its URL once it is ready, stops it after."""
    import yaml

    port = free_port()
    (tmp / "am.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/-/ready", proc=proc)
        yield url
    finally:
        stop(proc)


def scraping(*ports: int) -> dict[str, Any]:
    """A Prometheus configuration that scrapes gpuwarden on the local ``ports`` every second (job ``gpuwarden``)."""
    targets = [f"127.0.0.1:{p}" for p in ports]
    return {"global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "gpuwarden", "static_configs": [{"targets": targets}]}]}  # fmt: skip


def prometheus(binary: str, tmp: Path, config: dict[str, Any]) -> tuple[subprocess.Popen, str]:
    """Start a real Prometheus (``binary``) with ``config`` (written to ``tmp``/prometheus.yml) and its storage in
    ``tmp``; returns the process and its URL once /-/ready answers (through ``served``: started again on another port
    when its port was taken before it could bind it)."""
    import yaml

    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    flags = [f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}"]
    return served(lambda port: [binary, *flags, f"--web.listen-address=127.0.0.1:{port}"], "/-/ready")


@contextmanager
def backfilled_prometheus(prometheus_bin: str, promtool_bin: str, tmp: Path, series_om: str,
                          rule_passes: Sequence[tuple[Path, float, float]] = ()) -> Iterator[str]:  # fmt: skip
    """A real Prometheus over ``series_om`` (OpenMetrics text with timestamps, written to ``tmp``/series.om and turned
    into TSDB blocks by ``promtool tsdb create-blocks-from openmetrics``), nothing scraped; yields its URL once ready
    and stops it after. Each of ``rule_passes`` (rules file, start, end: Unix seconds) is then backfilled in turn with
    ``promtool tsdb create-blocks-from rules`` from the Prometheus holding what came before (a rule that reads another
    rule's records needs a pass after it), its blocks added to the storage. Raises AssertionError with promtool's
    error when the blocks cannot be made."""
    (tmp / "series.om").write_text(series_om)
    made = subprocess.run([promtool_bin, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "series.om"),
                           str(tmp / "tsdb")], capture_output=True, text=True, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    for n, (rules, start, end) in enumerate(rule_passes):
        server, url = prometheus(prometheus_bin, tmp, config)
        try:
            wait_http(f"{url}/-/ready", proc=server)
            out = tmp / f"rules-{n}"
            made = subprocess.run([promtool_bin, "tsdb", "create-blocks-from", "rules", f"--url={url}",
                                   f"--start={start:.0f}", f"--end={end:.0f}", f"--output-dir={out}", "--quiet",
                                   str(rules)], capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
            assert made.returncode == 0, made.stderr
        finally:
            stop_all([server])
        for block in out.iterdir():
            block.rename(tmp / "tsdb" / block.name)
    server, url = prometheus(prometheus_bin, tmp, config)
    try:
        wait_http(f"{url}/-/ready", proc=server)
        yield url
    finally:
        stop_all([server])


def gzip_bomb(inflated: int) -> bytes:
    """A gzip body of about a thousandth of ``inflated`` bytes that inflates to ``inflated`` bytes: spaces inside a
    valid start and end of a Prometheus API answer, compressed a MiB at a time (never held whole)."""
    import zlib

    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [c.compress(b'{"status":"success","data":{"resultType":"vector","result":[')]
    mib = b" " * (1 << 20)
    parts += [c.compress(mib) for _ in range(inflated >> 20)]
    return b"".join([*parts, c.compress(b"]}}"), c.flush()])


_FRESH: dict[str, bool] = {}


def generated(path: Path) -> Path:
    """``path``, a file tools/generate.py writes (the rules, their promtool copies, the memory cases), after checking
    that it is what its generator makes from the tree now: a test that reads a generated file fails, naming it and the
    command, when the template or a parameter changed and the generator was not run (it would test what was last
    generated). Each artefact is made once a session."""
    import importlib.util

    rel = str(path.resolve().relative_to(REPO))
    if rel not in _FRESH:
        spec = importlib.util.spec_from_file_location("tools_generate", REPO / "tools" / "generate.py")
        assert spec is not None and spec.loader is not None
        gen = sys.modules.setdefault("tools_generate", importlib.util.module_from_spec(spec))
        if not hasattr(gen, "ARTEFACTS"):
            spec.loader.exec_module(gen)  # registered first: dataclasses look their module up by name
        for artefact in gen.ARTEFACTS[:2]:  # the rules, then the memory promtool cases
            for made, text in artefact.make().items():
                _FRESH[made] = (REPO / made).read_text() == text
    assert rel in _FRESH, f"{rel}: not a file tools/generate.py writes"
    assert _FRESH[rel], f"{rel} is stale: run python3 tools/generate.py"
    return path


def promtool_alerts(promtool: str, tmp: Path, rules: Path, series: list[dict[str, str]], names: list[str],
                    eval_time: str = "5m") -> dict[str, list[dict[str, str]]]:  # fmt: skip
    """The alerts ``names`` firing at ``eval_time`` over ``rules`` with ``series`` (promtool input series, a minute
    apart), by name, each as its labels: a promtool unit test that expects none, its report of what it got read back
    (promtool prints each alert's labels; a test that got nothing passes and prints none)."""
    generated(rules)
    import yaml

    cases = [{"eval_time": eval_time, "alertname": n, "exp_alerts": []} for n in names]
    test = {"name": "scenario", "interval": "1m", "input_series": series, "alert_rule_test": cases}
    doc = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [test]}
    (tmp / "scenario.test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "scenario.test.yml"], cwd=tmp, capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert res.returncode in (0, 1), res.stderr
    got: dict[str, list[dict[str, str]]] = {n: [] for n in names}
    for block in (res.stdout + res.stderr).split("alertname: ")[1:]:
        name = block.split(",", 1)[0]
        for line in block.split("got:", 1)[1].splitlines() if "got:" in block else ():
            line = line.strip()
            if line.startswith("Labels:{"):
                pairs = line.removeprefix("Labels:{").rstrip("}").split(", ")
                got[name].append({k: v.strip('"') for k, v in (p.split("=", 1) for p in pairs)})
    return got


def notifications(alertmanager_bin: str | None, tmp: Path, alerts: list[dict[str, str]]) -> list[tuple[str, list[str]]]:
    """What a real Alertmanager (``alertmanager_bin``) with the shipped routes and inhibitions (group waits shortened
    to a second) sends for ``alerts`` (each its labels), posted at once: (receiver, the alert names of each
    notification), in the order they came."""
    assert alertmanager_bin is not None
    tmp.mkdir()
    end = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    with webhook() as hook, alertmanager(alertmanager_bin, tmp, shipped_routes(hook.port, "1s")) as am:
        body = [{"labels": a, "annotations": {}, "endsAt": end} for a in alerts]
        assert httpx.post(f"{am}/api/v2/alerts", json=body, timeout=10).status_code == 200
        deadline = time.monotonic() + 60
        while True:  # every alert processed (inhibited or not), then the groups' waits and a margin
            states = [a["status"]["state"] for a in httpx.get(f"{am}/api/v2/alerts", timeout=10).json()]
            if len(states) == len(alerts) and "unprocessed" not in states:
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.2)
        time.sleep(4)
    return [(recv, sorted({a["labels"]["alertname"] for a in b["alerts"]})) for recv, _, b in hook.got]


@dataclass
class Webhook:
    """A local stand-in for Alertmanager's receivers (``webhook()``): its ``port``, and each notification it got as
    (receiver: the path without slashes, monotonic time it came, its JSON body)."""

    port: int
    got: list[tuple[str, float, Any]] = field(default_factory=list)


@contextmanager
def webhook() -> Iterator[Webhook]:
    """A webhook receiver on a free port of 127.0.0.1 for the block (``Webhook``); every POST is answered 200."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hook = Webhook(0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            hook.got.append((self.path.strip("/"), time.monotonic(), json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.port = server.server_port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield hook
    finally:
        server.shutdown()


def shipped_routes(port: int, group_wait: str | None = None) -> dict[str, Any]:
    """gpuwarden/mixin/alertmanager.yml as shipped, every receiver a webhook at ``/RECEIVER`` on 127.0.0.1:``port``
    (no resolved notices), and where ``group_wait`` is given, every route's wait set to it (a test's minute)."""
    import yaml

    cfg: dict[str, Any] = yaml.safe_load((REPO / "gpuwarden" / "mixin" / "alertmanager.yml").read_text())
    if group_wait is not None:
        cfg["route"]["group_wait"] = group_wait
        for route in cfg["route"]["routes"]:
            route["group_wait"] = group_wait
    for r in cfg["receivers"]:
        r["webhook_configs"] = [{"url": f"http://127.0.0.1:{port}/{r['name']}", "send_resolved": False}]
    return cfg
