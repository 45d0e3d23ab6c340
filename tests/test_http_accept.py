"""The accept loop, the connections and the unsent-answer bounds (gpuwarden.web.server: accept, connection), in
process: gpuwarden's server in a thread, real sockets on the loopback. The apps answer with starlette's plain
Response: the server cuts every body into parts itself."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pki import PKI
from pki import make_pki as _make_pki
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpuwarden.web.server import accept, listener
from gpuwarden.web.server.limits import ANSWER_PART_BYTES, HttpLimits

BIG = b"x" * (40 * ANSWER_PART_BYTES)  # an answer of 640 KiB, in 40 parts


SERVED: list[str] = []  # the paths the app has begun to answer


def _app() -> Starlette:
    async def big(request: Request) -> Response:
        SERVED.append("/big")
        return Response(BIG, media_type="text/plain")  # one body: the server writes it in parts

    async def small(request: Request) -> Response:
        return Response(b"ok\n", media_type="text/plain")

    return Starlette(routes=[Route("/big", big), Route("/small", small)])


@contextmanager
def server(limits: HttpLimits, ssl_files: tuple[Path, Path] | None = None) -> Iterator[tuple[int, listener.Server]]:
    """gpuwarden's server on a free loopback port, in a thread, for the block; yields the port and the server."""
    sock = listener.bind("127.0.0.1:0", "127.0.0.1", 0)
    port = sock.getsockname()[1]
    context = None
    if ssl_files is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(ssl_files[0], ssl_files[1])
    srv = listener.Server(_app(), limits, tls=context)
    thread = threading.Thread(target=srv.run, args=(sock,), daemon=True)
    thread.start()
    assert srv.started.wait(10), "the server did not start"
    try:
        yield port, srv
    finally:
        srv.stop()
        thread.join(10)
        sock.close()


def _wait(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _get(port: int, path: str = "/small") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        return _read_to_end(s)


def _reset(s: socket.socket) -> None:
    """Close ``s`` with a reset (SO_LINGER 0), as a client that vanishes does."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def _protocols() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "Connection")


def test_a_reset_connection_is_not_held_by_the_keep_alive_timer() -> None:
    """A reset connection leaves nothing behind: no timer holds its protocol (and on TLS its state and buffers) for
    the keep-alive timeout."""
    limits = HttpLimits(keep_alive=120.0)
    with server(limits) as (port, _):
        before = _protocols()
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            _reset(s)
        _wait(lambda: limits.open == 0)
        assert _protocols() == before


def test_at_the_cap_the_oldest_idle_connection_makes_room_and_accept_never_fails() -> None:
    limits = HttpLimits(max_connections=8, head_timeout=30.0)
    with server(limits) as (port, _):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(30)]
        _wait(lambda: limits.counts["evicted"] >= 22)
        assert _get(port).startswith(b"HTTP/1.1 200")  # the scraper gets in: one more idle one made room
        assert limits.open <= limits.max_connections
        assert limits.counts["accept_failed"] == 0
        assert sum(_closed(s) for s in idle[:22]) == 22  # the oldest ones went
        for s in idle:
            s.close()
        _wait(lambda: limits.open == 0)


def test_at_the_cap_no_connection_is_closed_while_nobody_waits_to_be_accepted() -> None:
    """Reaching the cap closes nothing: only a connection waiting in the listen queue makes room (the accept loop
    closed the oldest idle connection as soon as the cap was reached, a connection sent its request there)."""
    limits = HttpLimits(max_connections=2, head_timeout=30.0)
    with server(limits) as (port, _):
        first = socket.create_connection(("127.0.0.1", port), timeout=5)
        _wait(lambda: len(limits.pending) == 1)
        second = socket.create_connection(("127.0.0.1", port), timeout=5)
        _wait(lambda: len(limits.pending) == 2)
        assert limits.counts["evicted"] == 0
        for s in (first, second):
            s.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 200")
            s.close()


def test_at_the_cap_with_every_connection_still_starting_accept_resumes_once_they_can_be_evicted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst fills the cap before any of its connections' protocols has started (each starts in a task after the
    accept batch): none is waiting for a head yet, so none can be evicted and the listener pauses. Once they start
    (held here until an event is set, not by a sleep), it accepts again and evicts the oldest: a scraper gets in
    within seconds, not at the 30 s head deadline."""
    gate = threading.Event()
    started = accept.Listener._connect

    async def held(self: accept.Listener, *args: Any) -> None:
        await asyncio.to_thread(gate.wait)
        await started(self, *args)

    monkeypatch.setattr(accept.Listener, "_connect", held)
    limits = HttpLimits(max_connections=4, head_timeout=30.0)
    with server(limits) as (port, _):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
        _wait(lambda: limits.open == 4)
        gate.set()
        assert _get(port).startswith(b"HTTP/1.1 200")
        assert limits.counts["evicted"] >= 3 and limits.counts["accept_failed"] == 0
        for s in idle:
            s.close()
        _wait(lambda: limits.open == 0)


def test_at_the_cap_with_every_connection_busy_new_ones_wait_in_the_listen_queue() -> None:
    """Connections inside a request are not evicted; a new one waits (not refused) until one closes."""
    limits = HttpLimits(max_connections=4, send_timeout=60.0)
    with server(limits) as (port, _):
        busy = []
        for _ in range(4):  # each asks for the big answer and reads none of it: inside a request
            s = _small_window()
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            busy.append(s)
        _wait(lambda: len(limits.stalled) == 4)
        waiting = socket.create_connection(("127.0.0.1", port), timeout=5)  # in the kernel's queue
        waiting.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
        waiting.settimeout(0.5)
        with pytest.raises(TimeoutError):
            waiting.recv(100)
        busy.pop().close()
        waiting.settimeout(5)
        assert waiting.recv(100).startswith(b"HTTP/1.1 200")
        for s in [*busy, waiting]:
            s.close()


def _small_window() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    return s


def _closed(s: socket.socket, timeout: float = 5.0) -> bool:
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def test_an_unread_answer_waits_in_parts_and_holds_back_the_next_pipelined_request() -> None:
    """A client that asks for a 640 KiB answer three times at once and reads nothing holds one part of the first
    answer on the daemon's side (not 640 KiB, nor three), and its other requests are not answered meanwhile."""
    limits = HttpLimits(send_timeout=60.0)
    with server(limits) as (port, _):
        s = _small_window()
        s.connect(("127.0.0.1", port))
        SERVED.clear()
        s.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n" * 3)
        _wait(lambda: len(limits.stalled) == 1)
        time.sleep(0.3)  # room for more to be written, were it to be
        (conn,) = limits.stalled
        assert conn.unsent() <= 2 * ANSWER_PART_BYTES
        assert SERVED == ["/big"]  # the other two held back, not started
        data = b""
        s.settimeout(5)
        while len(data) < 3 * len(BIG) or data.count(b"HTTP/1.1 200") < 3:  # once read, all three come in full
            chunk = s.recv(1 << 20)
            assert chunk, "closed"
            data += chunk
        assert data.count(BIG[:1000]) >= 3
        s.close()


def test_answers_over_the_unsent_budget_close_the_connection_waiting_longest() -> None:
    limits = HttpLimits(max_unsent_bytes=64 * 1024, send_timeout=60.0)
    with server(limits) as (port, _):
        held = []
        for _ in range(12):
            s = _small_window()
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            held.append(s)
            time.sleep(0.05)
        _wait(lambda: limits.counts["unsent_over_budget"] > 0)
        assert sum(c.unsent() for c in list(limits.stalled)) <= 64 * 1024 + 2 * ANSWER_PART_BYTES
        assert _closed(held[0])  # the one waiting longest went first
        assert _get(port).startswith(b"HTTP/1.1 200")
        for s in held:
            s.close()


def test_an_answer_that_waits_past_the_send_timeout_is_closed() -> None:
    limits = HttpLimits(send_timeout=0.5)
    with server(limits) as (port, _):
        s = _small_window()
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        _wait(lambda: limits.counts["send_timeout"] == 1)
        assert _closed(s)
        _wait(lambda: limits.open == 0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return _make_pki(tmp_path_factory)


def _tls_client(pki: PKI) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca.pem))


def test_silent_tls_connections_take_no_handshake_slot(pki: PKI) -> None:
    """Connections that never send a ClientHello wait as pending connections (no TLS state, no slot); a real client
    handshakes past them even with a single handshake slot."""
    limits = HttpLimits(max_handshakes=1, head_timeout=30.0)
    with server(limits, (pki.server.cert, pki.server.key)) as (port, _):
        silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(50)]
        _wait(lambda: len(limits.pending) == 50)
        assert not limits.handshaking
        for _ in range(5):
            with _tls_client(pki).wrap_socket(
                socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1"
            ) as t:
                t.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                assert t.recv(100).startswith(b"HTTP/1.1 200")
        assert limits.counts["handshake_evicted"] == 0
        for s in silent:
            s.close()


def test_a_connection_that_is_not_tls_is_closed_before_any_handshake(pki: PKI) -> None:
    limits = HttpLimits()
    with server(limits, (pki.server.cert, pki.server.key)) as (port, _):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _closed(s)
        _wait(lambda: limits.counts["handshake_failed"] == 1)
        _wait(lambda: limits.open == 0)


def test_a_client_hello_sent_a_byte_at_a_time_is_handshaken(pki: PKI) -> None:
    """A ClientHello that arrives in pieces takes its slot once whole (looked at again until then)."""
    limits = HttpLimits()
    with server(limits, (pki.server.cert, pki.server.key)) as (port, _):
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        tls, incoming, outgoing, hello = _hello(pki)
        for i in range(0, len(hello), 100):
            raw.sendall(hello[i : i + 100])
            time.sleep(0.02)
        assert _finish_and_get(raw, tls, incoming, outgoing).startswith(b"HTTP/1.1 200")
        assert limits.counts["handshake_failed"] == 0
        raw.close()


def _hello(pki: PKI) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, bytes]:
    """A client's TLS state over memory, and its complete ClientHello."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = _tls_client(pki).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return tls, incoming, outgoing, outgoing.read()


def _finish_and_get(raw: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> bytes:
    """Complete the handshake begun by ``tls`` over ``raw`` and GET /small: the answer's first bytes."""
    while True:
        data = raw.recv(65536)
        assert data, "the server closed the connection"
        incoming.write(data)
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())
    raw.sendall(outgoing.read())
    tls.write(b"GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    raw.sendall(outgoing.read())
    while True:
        data = raw.recv(65536)
        assert data, "the server closed the connection"
        incoming.write(data)
        try:
            return tls.read(100)
        except ssl.SSLWantReadError:
            continue


def test_client_hello_squatters_of_one_source_take_its_share_of_handshakes_only(pki: PKI) -> None:
    """A client mid-handshake, then sixteen connections from another address that send a complete ClientHello and
    nothing more (each makes the server do a key exchange and a signature): they evict each other past their
    source's share, never the client, which completes its handshake and gets its answer. (Evicting the oldest
    handshake at the cap closed the client's first.)"""
    limits = HttpLimits(max_handshakes=12, head_timeout=30.0)
    with server(limits, (pki.server.cert, pki.server.key)) as (port, _):
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        tls, incoming, outgoing, hello = _hello(pki)
        raw.sendall(hello)
        _wait(lambda: len(limits.handshaking) == 1)
        squatters = []
        for _ in range(16):
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
            s.sendall(_hello(pki)[3])
            squatters.append(s)
        seen = lambda: len(limits.handshaking) + limits.counts["handshake_evicted"]  # noqa: E731
        _wait(lambda: seen() == 17 and not limits.pending)
        assert _finish_and_get(raw, tls, incoming, outgoing).startswith(b"HTTP/1.1 200")
        assert limits.counts["handshake_evicted"] == 16 - accept.HANDSHAKES_PER_SOURCE
        raw.close()
        for s in squatters:
            s.close()


def test_a_source_starting_handshakes_faster_than_its_rate_is_refused_before_any_tls_work(
    pki: PKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its bucket a source's ClientHello is closed without a handshake (counted handshake_refused); another
    source handshakes meanwhile."""
    monkeypatch.setattr(accept, "HANDSHAKE_BURST", 5.0)
    monkeypatch.setattr(accept, "HANDSHAKE_RATE", 1e-6)  # no refill within the test
    limits = HttpLimits(head_timeout=30.0)
    with server(limits, (pki.server.cert, pki.server.key)) as (port, _):
        rushing = []

        def rush(n: int) -> None:
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.3", 0))
                s.sendall(_hello(pki)[3])
                rushing.append(s)

        rush(5)  # the bucket's five: their handshakes start (the accept loop hands each to its task)
        _wait(lambda: sum(h.source == "127.0.0.3" for h in limits.handshaking) == 5)
        rush(10)  # past the bucket, with its handshakes unfinished: each closed before any TLS work
        _wait(lambda: limits.counts["handshake_refused"] == 10 and not limits.pending)
        assert sum(_closed(s, 0.5) for s in rushing) >= 10  # the refused, closed by the server
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        tls, incoming, outgoing, hello = _hello(pki)
        raw.sendall(hello)
        assert _finish_and_get(raw, tls, incoming, outgoing).startswith(b"HTTP/1.1 200")
        raw.close()
        # clients of one address that finish their handshakes are not held back, however many
        for _ in range(10):
            t = _tls_client(pki).wrap_socket(
                socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.4", 0)),
                server_hostname="127.0.0.1",
            )
            t.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert t.recv(100).startswith(b"HTTP/1.1 200")
            t.close()
        assert limits.counts["handshake_refused"] == 10
        for s in rushing:
            s.close()


#: Requests at HTTP/1.1's edges (RFC 9112) and what each gets: a status (the connection closed after each refusal),
#: or the answer of a request read the lenient way RFC 9112 allows (obs-fold unfolded, bare LF as a line's end).
EDGES: dict[str, tuple[bytes, list[bytes]]] = {
    # both lengths: refused and closed (RFC 9112, 6.3), so the request behind it is not smuggled through
    "content-length and transfer-encoding": (
        b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
        b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n",
        [b"400"],
    ),
    "two content-lengths": (
        b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhi",
        [b"400"],
    ),
    "negative content-length": (b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n", [b"400"]),
    "transfer-encoding other than chunked": (
        b"POST /small HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n",
        [b"501"],
    ),
    "a body of 1 GB": (
        b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000000\r\n\r\n" + b"x" * 200_000,
        [b"413"],
    ),
    "a chunk of 17 TB": (
        b"POST /small HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nfffffffffff\r\n" + b"x" * 100_000,
        [b"413"],
    ),
    "20,000 headers": (b"GET /small HTTP/1.1\r\nhost: x\r\n" + b"a: b\r\n" * 20_000 + b"\r\n", [b"431"]),
    "a target of 100 kB": (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n", [b"431"]),
    "NUL in a header": (b"GET /small HTTP/1.1\r\nhost: x\r\nx-a: b\x00c\r\n\r\n", [b"400"]),
    "space before the colon": (b"GET /small HTTP/1.1\r\nhost : x\r\n\r\n", [b"400"]),
    "space in the target": (b"GET /sm all HTTP/1.1\r\nhost: x\r\n\r\n", [b"400"]),
    "no host": (b"GET /small HTTP/1.1\r\n\r\n", [b"400"]),
    "a method with a parenthesis": (b"G(T /small HTTP/1.1\r\nhost: x\r\n\r\n", [b"400"]),
    "HTTP/0.9": (b"GET /small\r\n\r\n", [b"400"]),
    "HTTP/3.0": (b"GET /small HTTP/3.0\r\nhost: x\r\n\r\n", [b"505"]),
    "the HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", [b"505"]),
    "obs-fold": (b"GET /small HTTP/1.1\r\nhost: x\r\nx-a: b\r\n  folded\r\nconnection: close\r\n\r\n", [b"200"]),
    "bare LF": (b"GET /small HTTP/1.1\nhost: x\nconnection: close\n\n", [b"200"]),
    "expect 100-continue": (
        b"POST /small HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc",
        [b"100", b"405"],
    ),
    "HEAD": (b"HEAD /big HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", [b"200"]),
}


def test_requests_at_http_edges_get_a_clean_status_and_the_server_serves_on() -> None:
    """Each request of EDGES gets its status (and after a refusal nothing more: the connection is closed), a HEAD
    answer has no body, and the server still answers afterwards."""
    with server(HttpLimits()) as (port, _):
        for name, (request, statuses) in EDGES.items():
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                with contextlib.suppress(OSError):  # the server may close before the whole request is sent
                    s.sendall(request)
                answer = b""
                with contextlib.suppress(ConnectionResetError):
                    while chunk := s.recv(65536):
                        answer += chunk
            seen = [line.split(b" ")[1] for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
            assert seen == statuses, (name, answer[:300])
            if name == "HEAD":
                assert answer.endswith(b"\r\n\r\n") and b"content-length: 655360" in answer.lower(), answer
        assert _get(port).startswith(b"HTTP/1.1 200")


def test_a_flood_gone_hands_its_memory_back_while_a_scraper_keeps_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The C heap is trimmed once a flood (FLOOD_CONNECTIONS or more) is gone, though the scraper's kept-alive
    connection stays open (trimming only at none open never trimmed a daemon Prometheus scrapes)."""
    from gpuwarden.web.server import limits as limits_module

    trims: list[float] = []

    def trim() -> bool:
        trims.append(time.monotonic())
        return True

    monkeypatch.setattr(limits_module, "release_free_heap", trim)
    limits, flood_size = HttpLimits(), limits_module.FLOOD_CONNECTIONS
    with server(limits) as (port, _):
        scraper = socket.create_connection(("127.0.0.1", port), timeout=5)

        def scrape() -> bytes:
            scraper.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
            data = b""
            while not data.endswith(b"\r\n\r\nok\n"):
                data += scraper.recv(65536)
            return data

        assert scrape().startswith(b"HTTP/1.1 200")  # kept alive
        flood = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(flood_size)]
        _wait(lambda: limits.open >= flood_size + 1)
        assert trims == []
        for s in flood:
            s.close()
        _wait(lambda: limits.open == 1)
        _wait(lambda: len(trims) == 1)  # a second after the flood is gone
        assert scrape().startswith(b"HTTP/1.1 200")  # the scraper's connection was never touched
        scraper.close()
    assert len(trims) == 1


# -- stopping (SIGTERM): what clients have sent is answered within the grace ---------------------------------------


def _read_to_end(s: socket.socket | ssl.SSLSocket) -> bytes:
    s.settimeout(5)
    data = b""
    while chunk := s.recv(1 << 20):
        data += chunk
    return data


def _all_closing(srv: listener.Server) -> bool:
    return (
        srv.listener is not None
        and srv.listener.closed
        and all(c.closing_after_answer for c in list(srv.listener.connections))
    )


def test_on_stop_every_request_sent_or_begun_is_answered_and_idle_connections_close() -> None:
    """The server stops with: a connection kept alive after its answer (closed at once, in order: no reset), one
    connected that has sent nothing yet, one holding half a request head, one whose 640 KiB answer its client reads
    through a 4 KiB window. The last three each get their whole answer, the new ones with ``Connection: close``."""
    limits = HttpLimits(send_timeout=60.0)
    with server(limits) as (port, srv):
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)
        idle.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
        kept = b""
        while not kept.endswith(b"\r\n\r\nok\n"):  # head and body may come in two reads
            chunk = idle.recv(1000)
            assert chunk, "closed"
            kept += chunk
        fresh = socket.create_connection(("127.0.0.1", port), timeout=5)
        half = socket.create_connection(("127.0.0.1", port), timeout=5)
        half.sendall(b"GET /small HTTP/1.1\r\nho")
        slow = _small_window()
        slow.connect(("127.0.0.1", port))
        slow.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        _wait(lambda: len(limits.stalled) == 1 and len(limits.pending) == 3)
        srv.stop()
        _wait(lambda: _all_closing(srv))
        assert _read_to_end(idle) == b""
        fresh.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
        half.sendall(b"st: x\r\n\r\n")
        for s in (fresh, half):
            answer = _read_to_end(s)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\nok\n")
            assert b"\r\nconnection: close\r\n" in answer.lower()
        answer = _read_to_end(slow)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n" + BIG)
        for s in (idle, fresh, half, slow):
            s.close()


def test_on_stop_a_tls_handshake_under_way_finishes_and_its_request_is_answered(pki: PKI) -> None:
    """A client whose ClientHello the server has taken may send its request as soon as its side of the handshake
    ends: the handshake is not cut when the server stops, and the request is answered."""
    limits = HttpLimits()
    with server(limits, (pki.server.cert, pki.server.key)) as (port, srv):
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        tls, incoming, outgoing, hello = _hello(pki)
        raw.sendall(hello)
        _wait(lambda: len(limits.handshaking) == 1)
        srv.stop()
        _wait(lambda: _all_closing(srv))
        assert _finish_and_get(raw, tls, incoming, outgoing).startswith(b"HTTP/1.1 200")
        raw.close()


@pytest.mark.parametrize("stopped", ["queued", "starting"])
def test_on_stop_a_connection_the_kernel_took_is_answered(stopped: str) -> None:
    """A client whose connection the kernel completed as the server stopped, and which sent its request at once, is
    answered: ``queued``, still in the listen queue when the listener closes (taken then); ``starting``, accepted
    but its protocol not yet started."""
    limits = HttpLimits()
    with server(limits) as (port, srv):
        assert srv._loop is not None
        held, go = threading.Event(), threading.Event()

        def hold() -> None:  # the loop, busy: the connection waits in the listen queue meanwhile
            held.set()
            go.wait(5)
            if stopped == "queued":
                srv._stop_now()  # before the loop looks at the listening socket again
            else:
                srv.stop()  # after it has: accepted, then the stop

        srv._loop.call_soon_threadsafe(hold)
        assert held.wait(5)
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
        go.set()
        answer = _read_to_end(s)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok\n")
        s.close()
