"""Attacks on a live daemon's port, as a hostile tenant of the node makes them (third round, docs/reliability.md):
clients that ask and never read, connections that never say a word and come back as soon as they are closed, a
burst of connections at the open-file limit. Each against ``gpuwarden serve --demo`` with a scraper beside it;
``tools/attack.py`` runs the same attacks inside a memory cgroup for the figures."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import serving
from pki import PKI, make_pki

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory)


def _tls_config(tmp: Path, pki: PKI) -> Path:
    web = tmp / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki.server.cert}\n  key_file: {pki.server.key}\n")
    return web


def _status(pid: int, key: str) -> float:
    """A /proc/PID/status memory figure in MiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(key)


def _kernel_send_queues_mib(port: int) -> float:
    """What the kernel holds unsent on the daemon's side of its connections (tx_queue of /proc/net/tcp, MiB): the
    memory a cgroup v2 limit charges to the daemon besides its own."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01":  # established, the daemon's end
            total += int(fields[4].split(":")[0], 16)
    return total / 2**20


def _closed_counts(url: str, ctx: ssl.SSLContext | bool, until: str = "") -> dict[str, float]:
    """gpuwarden_http_connections_closed_total by reason; with ``until``, asked again (for up to 10 s: the exposition
    is rendered at each poll) until that reason is above 0."""
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(url, verify=ctx, timeout=10).text
        pattern = r'^gpuwarden_http_connections_closed_total\{reason="(\w+)"\} (\S+)$'
        counts = {k: float(v) for k, v in re.findall(pattern, text, re.M)}
        if not until or counts.get(until, 0) > 0 or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def _scrape(url: str, ctx: ssl.SSLContext | bool) -> None:
    """One scrape on a new connection (a TLS handshake each time): answered in full within Prometheus's timeout."""
    r = httpx.get(url, verify=ctx, timeout=10, headers={"connection": "close"})
    assert r.status_code == 200 and b"gpu_up" in r.content


def test_a_thousand_tls_clients_that_never_read_leave_memory_bounded(pki: PKI, tmp_path: Path) -> None:
    """1,000 TLS connections, each with a 4 KiB receive window, pipeline 8 scrapes and read nothing. Before: asyncio
    let 512 KiB of each connection's answers pile up, the kernel's send buffers grew to 4 MiB each (260 MiB, charged
    to a cgroup v2 limit), and the daemon was killed in its 128 MiB cgroup. Now each answer waits one part at a time,
    the next request waits with it, the kernel holds 32 KiB a connection, and past the unsent budget the connection
    waiting longest is closed; scrapes on new connections keep answering."""
    ctx = ssl.create_default_context(cafile=str(pki.ca.pem))
    with serving("--web.config.file", str(_tls_config(tmp_path, pki)), log=tmp_path / "serve.log") as (proc, port):
        url = f"https://127.0.0.1:{port}/metrics"
        _scrape(url, ctx)
        request = b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n" * 8
        held: list[socket.socket] = []
        kernel = 0.0
        try:
            for i in range(1000):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(10)
                # a client each from its own address (127.0.1.1 ...): one source gets 20 handshakes at once
                s.bind((f"127.0.{1 + i // 250}.{1 + i % 250}", 0))
                s.connect(("127.0.0.1", port))
                t = ctx.wrap_socket(s, server_hostname="127.0.0.1")
                t.sendall(request)
                held.append(t)
                if i % 250 == 249:
                    _scrape(url, ctx)
            time.sleep(1.0)
            kernel = _kernel_send_queues_mib(port)
            for _ in range(5):
                _scrape(url, ctx)
            peak = _status(proc.pid, "VmHWM")
            counts = _closed_counts(url, ctx, until="unsent_over_budget")
        finally:
            for s in held:
                with contextlib.suppress(OSError):
                    s.close()
        assert proc.poll() is None
    assert peak < 128, peak
    assert kernel < 48, kernel  # 1,000 connections at most 32 KiB each
    assert counts["unsent_over_budget"] > 0, counts


def test_silent_connections_that_come_back_at_once_do_not_take_real_handshakes(pki: PKI, tmp_path: Path) -> None:
    """300 connections that send nothing, each opened again as soon as the daemon closes it (head deadline 1 s).
    Before: each took a handshake slot and evicted the oldest - a real client's handshake in progress - and every
    scrape failed. Now a connection takes a slot only once its ClientHello has come."""
    ctx = ssl.create_default_context(cafile=str(pki.ca.pem))
    env = {**os.environ, "GPUWARDEN_REQUEST_HEAD_TIMEOUT_SECONDS": "1"}
    log = tmp_path / "serve.log"
    with serving("--web.config.file", str(_tls_config(tmp_path, pki)), log=log, env=env) as (proc, port):
        url = f"https://127.0.0.1:{port}/metrics"
        stop = threading.Event()
        opened = [0]

        def squat() -> None:
            import select

            held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
            opened[0] += len(held)
            while not stop.is_set():
                ready, _, _ = select.select(held, [], [], 0.05)
                for s in ready:
                    held.remove(s)
                    s.close()
                    with contextlib.suppress(OSError):
                        held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
                        opened[0] += 1
            for s in held:
                s.close()

        squatter = threading.Thread(target=squat, daemon=True)
        squatter.start()
        try:
            time.sleep(1.5)  # the first round closed and reopened
            failures = 0
            for _ in range(20):
                try:
                    _scrape(url, ctx)
                except (httpx.HTTPError, AssertionError):
                    failures += 1
                time.sleep(0.1)
        finally:
            stop.set()
            squatter.join(10)
        counts = _closed_counts(url, ctx, until="head_timeout")
        assert proc.poll() is None
    assert opened[0] > 300  # they did come back
    assert failures == 0
    assert counts["handshake_evicted"] == 0 and counts["head_timeout"] >= 300, counts


@contextlib.contextmanager
def _burst(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` idle connections opened at once by 16 threads side by side; closed after the block."""
    held: list[socket.socket] = []

    def connect(k: int) -> None:
        for _ in range(k):
            with contextlib.suppress(OSError):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=10))

    threads = [threading.Thread(target=connect, args=(n // 16,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        yield held
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_burst_of_connections_at_the_open_file_limit_never_fails_accept(pki: PKI, tmp_path: Path, tls: bool) -> None:
    """1,600 connections opened at once by 16 clients, the daemon's open-file limit 1,024. Before: asyncio accepted
    a listen backlog of them in one go before any protocol could evict, accept failed with "Too many open files" and
    asyncio stopped accepting for a second (scrapes waited up to 1 s). Now every accepted socket is counted and accept
    waits at the cap for the oldest idle one to close."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    args = ("--web.config.file", str(_tls_config(tmp_path, pki))) if tls else ()
    ctx: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(pki.ca.pem)) if tls else False
    log = tmp_path / "serve.log"
    with serving(*args, log=log, preexec_fn=limit) as (proc, port):
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/metrics"
        with _burst(port, 1600) as held:
            assert len(held) == 1600  # every one connected: none refused
            for _ in range(10):
                _scrape(url, ctx)
        counts = _closed_counts(url, ctx, until="evicted")
        assert proc.poll() is None
    text = log.read_text()
    assert "Too many open files" not in text and "out of system resource" not in text
    assert counts["accept_failed"] == 0 and counts["evicted"] > 0, counts
