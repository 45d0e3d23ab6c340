#!/usr/bin/env python3
"""Attacks on a live daemon's HTTP port, as a hostile tenant of the node would make them, with figures.

Starts ``gpuwarden serve --demo`` (plain HTTP or TLS with a throw-away self-signed certificate) inside a memory
cgroup of ``--memory-limit`` (cgroup v2 where its memory controller is delegated, else cgroup v1; needs root: without
either, only the process's own peak resident memory is read), lets a scraper scrape ``/metrics`` on a new connection
every ``--scrape-every`` seconds (a TLS handshake each time, as a restarted Prometheus would), runs one attack beside
it for ``--duration`` seconds, and prints one JSON object: the attack, Python's version, the cgroup's peak memory (on
cgroup v1 its sockets' kernel buffers apart: v2 counts them in the peak) and whether the kernel killed the daemon
for memory, its peak resident memory (VmHWM), the scrapes answered and failed
with their p50/p99/max, and the daemon's ``gpuwarden_http_connections_closed_total`` by reason.

Attacks:

- ``unread``: ``--connections`` connections (each with a 4 KiB receive buffer, so that the answers wait on the daemon's
  side) each send ``--pipelined`` ``GET /metrics`` at once and never read;
- ``squat``: ``--connections`` connections that send nothing; each one the server closes is opened again at once;
- ``hello``: ``--connections`` connections from 127.0.0.2 (another address than the scraper's) that send a complete
  TLS ClientHello and then nothing (each costs the server a key exchange and a signature); each one the server
  closes is opened again at once (needs ``--tls``);
- ``head``: ``--connections`` connections (each with a 4 KiB receive window, so that its answer stays in flight) each
  send a ``GET /metrics`` and then the next request's head without end (``a: b`` lines, as fast as the server takes
  them); each one the server closes is opened again at once;
- ``fdlimit``: the daemon runs with an open-file limit of ``--nofile``; ``--connections`` idle connections are held;
- ``guess``: basic auth on (a bcrypt hash of cost ``--bcrypt-cost``); ``--connections`` password guessers from
  127.0.0.2, each on its own kept-alive connection, send wrong passwords as fast as they are answered; the scraper
  keeps its connection alive with the right password, as Prometheus does, so its figures are a scrape's wait behind
  the guessers;
- ``soak``: basic auth on; no attack, the scraper alone on a kept-alive connection for ``--duration`` (twenty
  minutes at one scrape a second is the soak of docs/reliability.md): the daemon's resident memory at the start and
  the end, and each minute, say whether it grows.

Traffic goes to 127.0.0.1 only and every run ends by itself. Usage::

    sudo python3 tools/attack.py unread --tls --connections 800 --pipelined 8
    sudo python3 tools/attack.py squat --tls --connections 300 --python python3.12
    sudo python3 tools/attack.py hello --tls --connections 300
    sudo python3 tools/attack.py head --tls --connections 8
    sudo python3 tools/attack.py guess --tls --connections 50 --scrape-every 1
    sudo python3 tools/attack.py soak --tls --duration 1200 --scrape-every 1
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import resource
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def self_signed(dir: Path) -> tuple[Path, Path]:
    """A throw-away EC certificate and key for 127.0.0.1 in ``dir``: (cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    c, k = dir / "server.crt", dir / "server.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return c, k


class Cgroup:
    """A memory cgroup for the daemon: v2 where the memory controller is delegated, else v1, else none (then
    ``peak_mib`` is None). ``join`` moves a process in; ``oom_killed`` says whether the kernel killed one for
    memory."""

    def __init__(self, limit_bytes: int) -> None:
        self.path: Path | None = None
        self.version = 0
        name = f"gpuwarden-attack-{os.getpid()}"
        v2 = Path("/sys/fs/cgroup")
        candidates = [(v2, 2), (v2 / "unified", 2), (v2 / "memory", 1)]
        for root, version in candidates:
            controllers = root / "cgroup.controllers"
            if version == 2 and not (controllers.exists() and "memory" in controllers.read_text().split()):
                continue
            if version == 1 and not (root / "memory.limit_in_bytes").exists():
                continue
            try:
                (root / name).mkdir()
            except OSError:
                continue
            self.path, self.version = root / name, version
            try:
                if version == 2:
                    (self.path / "memory.max").write_text(str(limit_bytes))
                    (self.path / "memory.swap.max").write_text("0")
                else:
                    (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                    with contextlib.suppress(OSError):
                        (self.path / "memory.swappiness").write_text("0")
                    with contextlib.suppress(OSError):  # counts the sockets' kernel buffers (v2 charges them always)
                        (self.path / "memory.kmem.tcp.limit_in_bytes").write_text(str(2**40))
            except OSError:
                self.path.rmdir()
                self.path, self.version = None, 0
                continue
            break

    def join(self) -> None:
        """Move the calling process into the cgroup (for a child's preexec_fn)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_mib(self) -> float | None:
        """The most memory the cgroup held (MiB), or None without one."""
        if self.path is None:
            return None
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            return int((self.path / name).read_text()) / 2**20
        return None

    def socket_buffers_peak_mib(self) -> float | None:
        """cgroup v1: the most kernel memory the cgroup's sockets held (MiB; v2 counts it in ``peak_mib``)."""
        if self.path is None or self.version != 1:
            return None
        with contextlib.suppress(OSError, ValueError):
            return int((self.path / "memory.kmem.tcp.max_usage_in_bytes").read_text()) / 2**20
        return None

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the cgroup for memory."""
        if self.path is None:
            return False
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError):
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        return False

    def remove(self) -> None:
        """Remove the cgroup (once its processes have exited)."""
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def free_port() -> int:
    """A free TCP port of 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vm_hwm_mib(pid: int, field: str = "VmHWM") -> float | None:
    """The peak resident memory of process ``pid`` (VmHWM, MiB; ``field="VmRSS"``: the current), or None once it
    is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return None


#: The users of ``guess`` and ``soak``: the scraper's name and password (the guessers try others).
USER, PASSWORD = "prometheus", "right-password"


def client_context() -> ssl.SSLContext:
    """A TLS client context that trusts anything (the certificate is the run's own)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Scraper(threading.Thread):
    """Scrapes ``url`` every ``every`` s until stopped, on a new connection each time, or on one kept alive with
    basic auth (``keep_alive``: as Prometheus scrapes): latencies (s) and failures."""

    def __init__(self, url: str, every: float, keep_alive: bool = False) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.keep_alive = url, every, keep_alive
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        """Scrape until ``halt`` is set."""
        auth = (USER, PASSWORD) if self.keep_alive else None
        headers = {} if self.keep_alive else {"connection": "close"}
        with httpx.Client(verify=client_context(), timeout=10, auth=auth, headers=headers) as client:
            while not self.halt.is_set():
                t0 = time.monotonic()
                try:
                    r = client.get(self.url)
                    if r.status_code != 200 or b"gpu_up" not in r.content:
                        self.failures.append(f"status {r.status_code}")
                except httpx.HTTPError as exc:
                    self.failures.append(type(exc).__name__)
                self.latencies.append(time.monotonic() - t0)
                self.halt.wait(max(0.0, self.every - (time.monotonic() - t0)))


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``, or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def unread(port: int, tls: bool, connections: int, pipelined: int, until: float) -> dict[str, int]:
    """Open ``connections`` connections, each sending ``pipelined`` scrapes at once, reading nothing; hold them
    until ``until`` (monotonic). Returns how many opened and how many the server closed by then."""
    request = b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n" * pipelined
    held: list[socket.socket] = []
    failed = 0
    ctx = client_context()
    for _ in range(connections):
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the answer waits on the daemon
            s.settimeout(10)
            s.connect(("127.0.0.1", port))
            if tls:
                s = ctx.wrap_socket(s)
            s.sendall(request)
            held.append(s)
        except OSError:
            failed += 1
    while time.monotonic() < until:
        time.sleep(0.2)
    closed = sum(_closed(s) for s in held)
    for s in held:
        s.close()
    return {"opened": len(held), "failed_to_open": failed, "closed_by_server": closed}


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (reset, or readable to its end without blocking)."""
    try:
        s.setblocking(False)
        raw = s.detach() if isinstance(s, ssl.SSLSocket) else s.fileno()
        fd = raw if isinstance(raw, int) else raw
        while True:
            r, _, _ = select.select([fd], [], [], 0)
            if not r:
                return False
            if not os.read(fd, 1 << 20):
                return True
    except OSError:
        return True


def squat(port: int, connections: int, until: float) -> dict[str, int]:
    """Hold ``connections`` connections that send nothing; each one the server closes is opened again at once,
    until ``until``. Returns the connections opened in all."""
    opened = 0
    held: list[socket.socket] = []
    while len(held) < connections:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        opened += 1
    while time.monotonic() < until:
        ready, _, _ = select.select(held, [], [], 0.05)
        for s in ready:
            with contextlib.suppress(OSError):
                if s.recv(1):
                    continue
            held.remove(s)
            s.close()
            with contextlib.suppress(OSError):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
                opened += 1
    for s in held:
        s.close()
    return {"opened": opened}


def _client_hello() -> bytes:
    """A complete TLS ClientHello, as a client's first flight."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context().wrap_bio(incoming, outgoing)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def hello(port: int, connections: int, until: float, threads: int = 8) -> dict[str, int]:
    """Hold ``connections`` connections from 127.0.0.2 that each sent a complete ClientHello and nothing more, from
    ``threads`` threads side by side; each one the server closes is opened again at once (with a fresh ClientHello),
    until ``until``. Returns the connections opened in all."""
    opened = [0] * threads

    def run(k: int, n: int) -> None:
        held: list[socket.socket] = []

        def open_one() -> None:
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
                s.sendall(_client_hello())
                held.append(s)
                opened[k] += 1

        while len(held) < n:
            open_one()
        while time.monotonic() < until:
            ready, _, _ = select.select(held, [], [], 0.05)
            for s in ready:
                with contextlib.suppress(OSError):
                    if s.recv(65536):  # the server's flight: read it, send nothing
                        continue
                held.remove(s)
                s.close()
                open_one()
        for s in held:
            s.close()

    workers = [threading.Thread(target=run, args=(k, connections // threads)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"opened": sum(opened)}


def head(port: int, tls: bool, connections: int, until: float) -> dict[str, int]:
    """Hold ``connections`` connections that each send a scrape, read nothing, and then stream the next request's
    head for ever (``a: b`` header lines) from 4 threads; each one the server closes is opened again, until
    ``until``. Returns the connections opened."""
    ctx = client_context()
    opened = [0] * 4
    line = b"a: b\r\n" * 1024

    def open_one() -> socket.socket | None:
        with contextlib.suppress(OSError):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(10)
            s.connect(("127.0.0.1", port))
            if tls:
                s = ctx.wrap_socket(s)
            s.sendall(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\nGET /metrics HTTP/1.1\r\n")
            s.settimeout(0.05)
            return s
        return None

    def run(k: int, n: int) -> None:
        held = [s for s in (open_one() for _ in range(n)) if s is not None]
        opened[k] += len(held)
        while time.monotonic() < until:
            for i, s in enumerate(held):
                try:
                    s.send(line)
                except (TimeoutError, BlockingIOError, ssl.SSLWantWriteError):
                    continue
                except OSError:  # closed by the server: again
                    s.close()
                    again = open_one()
                    if again is not None:
                        held[i] = again
                        opened[k] += 1
        for s in held:
            s.close()

    workers = [threading.Thread(target=run, args=(k, max(1, connections // 4))) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"opened": sum(opened)}


def guess(url: str, connections: int, until: float) -> dict[str, int]:
    """``connections`` guessers from 127.0.0.2 (not the scraper's address), each a thread on its own kept-alive
    connection, sending wrong passwords as fast as they are answered until ``until``. Returns the guesses answered,
    by status (or the client's error)."""
    answered: dict[str, int] = {}
    lock = threading.Lock()

    def run(k: int) -> None:
        transport = httpx.HTTPTransport(verify=client_context(), local_address="127.0.0.2")  # a tenant's address
        with httpx.Client(transport=transport, timeout=30) as client:
            n = 0
            while time.monotonic() < until:
                n += 1
                try:
                    status = str(client.get(url, auth=(USER, f"guess-{k}-{n}")).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with lock:
                    answered[status] = answered.get(status, 0) + 1

    workers = [threading.Thread(target=run, args=(k,)) for k in range(connections)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return answered


def hold(until: float) -> dict[str, int]:
    """No attack: wait until ``until`` (the scraper runs alone). Returns {}."""
    time.sleep(max(0.0, until - time.monotonic()))
    return {}


def idle(port: int, connections: int, until: float) -> dict[str, int]:
    """Open ``connections`` idle connections at once (16 threads connecting side by side, a burst) and hold them
    until ``until``. Returns how many opened."""
    held: list[socket.socket] = []
    failed = 0

    def connect(n: int) -> None:
        nonlocal failed
        for _ in range(n):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                failed += 1

    threads = [threading.Thread(target=connect, args=(connections // 16 + (i < connections % 16),)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while time.monotonic() < until:
        time.sleep(0.2)
    for s in held:
        s.close()
    return {"opened": len(held), "failed_to_open": failed}


def closed_counts(url: str, auth: tuple[str, str] | None = None) -> dict[str, float]:
    """The daemon's gpuwarden_http_connections_closed_total by reason ({} when it does not answer)."""
    try:
        text = httpx.get(url, verify=client_context(), timeout=10, auth=auth).text
    except httpx.HTTPError:
        return {}
    pattern = r'^gpuwarden_http_connections_closed_total\{reason="(\w+)"\} (\S+)$'
    return {k: float(v) for k, v in re.findall(pattern, text, re.M)}


@contextlib.contextmanager
def daemon(
    python: str, tls: bool, cgroup: Cgroup, nofile: int | None, log: Path, bcrypt_cost: int | None = None
) -> Iterator[tuple[int, int]]:
    """Run ``python -m gpuwarden serve --demo`` in ``cgroup`` (TLS with a fresh certificate when ``tls``, open-file
    limit ``nofile``, basic auth for USER with a hash of cost ``bcrypt_cost`` when given); yield (pid, port) once it
    serves, stop it after."""
    port = free_port()
    args = [python, "-m", "gpuwarden", "serve", "--demo", "--web.listen-address", f"127.0.0.1:{port}"]
    with tempfile.TemporaryDirectory() as tmp:
        web = ""
        if tls:
            cert, key = self_signed(Path(tmp))
            web += f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        if bcrypt_cost is not None:
            import bcrypt

            hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(bcrypt_cost)).decode()
            web += f"basic_auth_users:\n  {USER}: '{hashed}'\n"
        if web:
            (Path(tmp) / "web.yml").write_text(web)
            args += ["--web.config.file", str(Path(tmp) / "web.yml")]

        def enter() -> None:
            cgroup.join()
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(log, "wb") as out:
            proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, preexec_fn=enter)
        try:
            deadline = time.monotonic() + 60
            while "serving" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"attack: the daemon did not start: {log.read_text()[-500:]}")
                time.sleep(0.1)
            yield proc.pid, port
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Run one attack and print its figures as one JSON object; 0, or 1 when the daemon died."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attack", choices=["unread", "squat", "hello", "head", "fdlimit", "guess", "soak"])
    parser.add_argument("--tls", action="store_true", help="serve TLS (a fresh self-signed certificate)")
    parser.add_argument("--connections", type=int, default=800)
    parser.add_argument("--pipelined", type=int, default=8, help="unread: scrapes each connection sends at once")
    parser.add_argument("--nofile", type=int, default=1024, help="fdlimit: the daemon's open-file limit")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds the attack is held")
    parser.add_argument("--scrape-every", type=float, default=0.1)
    parser.add_argument("--memory-limit", default="128M", help="the cgroup's memory limit (K, M, G suffixes)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs the daemon")
    parser.add_argument("--bcrypt-cost", type=int, default=12, help="guess, soak: the cost of the user's hash")
    args = parser.parse_args(argv)
    auth = args.attack in ("guess", "soak")
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    limit = args.memory_limit.upper()
    limit_bytes = int(limit[:-1]) * units[limit[-1]] if limit[-1] in units else int(limit)
    cgroup = Cgroup(limit_bytes)
    log = Path(tempfile.mkstemp(prefix="gpuwarden-attack-", suffix=".log")[1])
    scheme = "https" if args.tls else "http"
    result: dict[str, object] = {"attack": args.attack, "tls": args.tls, "connections": args.connections}
    try:
        nofile = args.nofile if args.attack == "fdlimit" else None
        with daemon(args.python, args.tls, cgroup, nofile, log, args.bcrypt_cost if auth else None) as (pid, port):
            url = f"{scheme}://127.0.0.1:{port}/metrics"
            version = subprocess.run([args.python, "--version"], capture_output=True, text=True).stdout.strip()
            result["python"] = version
            time.sleep(2.0)
            result["rss_before_mib"] = round(vm_hwm_mib(pid) or 0, 1)
            result["rss_start_mib"] = round(vm_hwm_mib(pid, "VmRSS") or 0, 1)
            scraper = Scraper(url, args.scrape_every, keep_alive=auth)
            scraper.start()
            each_minute: list[float] = []

            def sample() -> None:
                while not scraper.halt.wait(60.0):
                    each_minute.append(round(vm_hwm_mib(pid, "VmRSS") or 0, 1))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            until = time.monotonic() + args.duration
            run: Callable[[], dict[str, int]]
            if args.attack == "unread":
                run = lambda: unread(port, args.tls, args.connections, args.pipelined, until)  # noqa: E731
            elif args.attack == "squat":
                run = lambda: squat(port, args.connections, until)  # noqa: E731
            elif args.attack == "hello":
                run = lambda: hello(port, args.connections, until)  # noqa: E731
            elif args.attack == "head":
                run = lambda: head(port, args.tls, args.connections, until)  # noqa: E731
            elif args.attack == "guess":
                run = lambda: guess(url, args.connections, until)  # noqa: E731
            elif args.attack == "soak":
                run = lambda: hold(until)  # noqa: E731
            else:
                run = lambda: idle(port, args.connections, until)  # noqa: E731
            result["clients"] = run()
            scraper.halt.set()
            scraper.join()
            alive = (Path(f"/proc/{pid}").exists()) and vm_hwm_mib(pid) is not None
            result["daemon_alive"] = alive
            result["peak_rss_mib"] = round(vm_hwm_mib(pid) or 0, 1)
            result["rss_end_mib"] = round(vm_hwm_mib(pid, "VmRSS") or 0, 1)
            result["rss_each_minute_mib"] = each_minute
            result["cgroup_peak_mib"] = None if cgroup.peak_mib() is None else round(cgroup.peak_mib() or 0, 1)
            sockets = cgroup.socket_buffers_peak_mib()
            result["socket_buffers_peak_mib"] = None if sockets is None else round(sockets, 1)
            result["oom_killed"] = cgroup.oom_killed()
            lat = scraper.latencies
            result["scrapes"] = len(lat)
            result["scrapes_failed"] = len(scraper.failures)
            result["scrape_p50_s"] = None if not lat else round(percentile(lat, 0.5) or 0, 4)
            result["scrape_p99_s"] = None if not lat else round(percentile(lat, 0.99) or 0, 4)
            result["scrape_max_s"] = None if not lat else round(max(lat), 4)
            time.sleep(1.5)  # the exposition is rendered at each poll
            result["closed"] = closed_counts(url, (USER, PASSWORD) if auth else None) if alive else {}
            result["scrape_failures"] = sorted(set(scraper.failures))
            text = log.read_text(errors="replace")
            result["log_lines_too_many_open_files"] = text.count("Too many open files")
    finally:
        cgroup.remove()
        log.unlink(missing_ok=True)
    print(json.dumps(result))
    return 0 if result.get("daemon_alive") else 1


if __name__ == "__main__":
    sys.exit(main())
