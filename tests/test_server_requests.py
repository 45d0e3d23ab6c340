"""A server's own word on its requests (gpuwarden.server_requests): the engines' gauges parsed from their Prometheus
text, read from a real local HTTP server within bounds (no redirect, bytes, time), and what the insight makes of it:
a server that says it has had no request for a while is serving_idle (its time, its verdict, /api/v1/idleness),
one that says it has requests, or says nothing, is serving and active, and what it says never makes a GPU that runs
kernels idle. The GPU side is the real H200 recording of a notebook-shaped process (20 GiB held, nothing running),
its process given a server's listening port and request counts in the test (annotate: the recording itself is
unchanged)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from conftest import TRACES

from gpuwarden import server_requests as sr
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.model import GpuReading
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource
from gpuwarden.web.idleness import idleness_document

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="0",model_name="qwen"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.4
"""
SGLANG = (
    "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n"
    "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 0\n"
)
TGI = "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 5\n# TYPE tgi_queue_size gauge\ntgi_queue_size 7\n"


def _triton(done: int, pending: int) -> str:
    return (
        "# TYPE nv_inference_request_success counter\n"
        f'nv_inference_request_success{{model="resnet",version="1"}} {done}\n'
        "# TYPE nv_inference_pending_request_count gauge\n"
        f'nv_inference_pending_request_count{{model="resnet",version="1"}} {pending}\n'
    )


@pytest.mark.parametrize(
    ("text", "running", "waiting"),
    [(VLLM, 4.0, 2.0), (SGLANG, 0.0, 0.0), (TGI, 5.0, 7.0)],
)
def test_the_engines_gauges_are_summed_over_their_models(text: str, running: float, waiting: float) -> None:
    got = sr.parse_requests(text, now=1.0)
    assert got is not None and (got.running, got.waiting) == (running, waiting)
    assert got.active == (running + waiting > 0)


def test_a_request_done_between_two_reads_counts_as_running() -> None:
    """The gauges are one moment each; a request that ran between two reads shows in the counters of requests done
    (vLLM's request_success_total, TGI's request count, Triton's, which has no gauge of requests running)."""
    idle = VLLM.replace(" 3.0", " 0.0").replace(" 1.0", " 0.0").replace(" 2.0", " 0.0")
    counted = idle + '# TYPE vllm:request_success counter\nvllm:request_success_total{finished_reason="stop"} 7\n'
    before = sr.parse_requests(counted)
    assert before is not None and not before.active and before.done_total == 7.0
    after = sr.parse_requests(counted.replace("} 7", "} 9"), before)
    assert after is not None and after.active and after.running == 1.0
    assert not sr.parse_requests(counted, before).active  # type: ignore[union-attr]


def test_triton_runs_a_request_when_its_requests_done_grew() -> None:
    first = sr.parse_requests(_triton(10, 0))
    assert first is not None and (first.running, first.waiting, first.done_total) == (0.0, 0.0, 10.0)
    same = sr.parse_requests(_triton(10, 0), first)
    assert same is not None and not same.active
    grew = sr.parse_requests(_triton(12, 1), same)
    assert grew is not None and (grew.running, grew.waiting) == (1.0, 1.0)


@pytest.mark.parametrize(
    "text",
    [
        "",  # nothing
        "# TYPE http_requests_total counter\nhttp_requests_total 5\n",  # not an engine
        "<html><body>Not Found</body></html>",  # not Prometheus text
        'vllm:num_requests_running{model_name="a" 3\n',  # a broken line
        "vllm:num_requests_running NaN\nvllm:num_requests_waiting -4\n",  # no reading, only garbage values
    ],
)
def test_a_server_that_says_nothing_usable_says_nothing(text: str) -> None:
    got = sr.parse_requests(text)
    assert got is None or not got.active  # never a request made up
    if "vllm" not in text:
        assert got is None


class _Server:
    """A real HTTP server on 127.0.0.1 answering GET /metrics with ``body()`` (or what ``handler`` does)."""

    def __init__(self, handler: Callable[[http.server.BaseHTTPRequestHandler], None]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                handler(self)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _answer(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Callable[..., None]:
    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return handle


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(sr.REQUESTS_TIMEOUT_SECONDS), follow_redirects=False) as c:
        yield c


def test_a_server_is_read_at_its_port_on_loopback(client: httpx.Client) -> None:
    srv = _Server(_answer(VLLM.encode()))
    try:
        assert sr.fetch(client, srv.port) == VLLM
    finally:
        srv.close()


def test_a_redirect_an_error_or_a_port_without_http_says_nothing(client: httpx.Client) -> None:
    moved = _Server(_answer(b"", 302, {"Location": "http://203.0.113.1/metrics"}))  # never followed off the host
    broken = _Server(_answer(b"oops", 500))
    try:
        assert sr.fetch(client, moved.port) is None
        assert sr.fetch(client, broken.port) is None
    finally:
        moved.close()
        broken.close()
    import socket

    with socket.socket() as s:  # a port that accepts and never answers HTTP
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with httpx.Client(timeout=httpx.Timeout(0.3), follow_redirects=False) as quick:
            assert sr.fetch(quick, port) is None


def test_a_body_too_large_or_too_slow_is_left(client: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sr, "REQUESTS_MAX_BYTES", 1000)
    big = _Server(_answer(b"#" * 5000))

    def drip(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        for _ in range(50):  # a byte every 0.1 s: each read within httpx's timeout, the whole far past ours
            h.wfile.write(b"#")
            h.wfile.flush()
            time.sleep(0.1)

    slow = _Server(drip)
    monkeypatch.setattr(sr, "REQUESTS_TIMEOUT_SECONDS", 0.5)
    try:
        assert sr.fetch(client, big.port) is None
        started = time.monotonic()
        assert sr.fetch(client, slow.port) is None
        assert time.monotonic() - started < 3.0
    finally:
        big.close()
        slow.close()


def test_the_reader_answers_from_its_thread_and_never_blocks_the_caller() -> None:
    """latest() asks for a read and answers what the last read gave: None at first, then the server's requests; a
    process gone is forgotten."""
    srv = _Server(_answer(TGI.encode()))
    reader = sr.RequestReader()
    try:
        assert reader.latest(42, [1, srv.port]) is None  # port 1 answers nothing: the next port is asked
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            time.sleep(0.02)
            got = reader._got.get(42)  # the thread's answer, without asking again
        assert got is not None and (got.running, got.waiting) == (5.0, 7.0)
        assert reader.latest(42, [srv.port]) == got  # not due again: no new read
        reader.forget_except(set())
        assert reader.latest(43, []) is None and 42 not in reader._got
    finally:
        reader.close()
        srv.close()


def _served(ports: list[int] | None, running: float | None, waiting: float | None) -> Callable[..., list[GpuReading]]:
    """An annotate that gives every process of the recording a server's listening ports and request counts."""

    def annotate(gpus: list[GpuReading]) -> list[GpuReading]:
        update = {"listen_ports": ports, "server_requests_running": running, "server_requests_waiting": waiting}
        return [
            g.model_copy(update={"processes": [p.model_copy(update=update) for p in g.processes or ()]}) for g in gpus
        ]

    return annotate


def _replay(trace: str, annotate: Callable[..., list[GpuReading]], idle_after: float = 10.0) -> Poller:
    source = ReplaySource(TRACES / f"{trace}.jsonl.gz", timing="recorded", annotate=annotate)  # type: ignore[arg-type]
    analyzer = InsightAnalyzer(serving_idle_seconds=idle_after)
    poller = Poller(source, 1.0, analyzers={"insight": analyzer.prepare})
    poller.start(thread=False)
    for _ in range(22):
        poller.poll_once()
    return poller


def _verdict_and_idleness(p: Poller) -> tuple[str, dict, dict[str, float]]:  # type: ignore[type-arg]
    from gpuwarden.insight.vocabulary.result import snapshot_insight

    assert p.snapshot is not None
    res = snapshot_insight(p.snapshot)
    assert res is not None
    g = res.gpus[0]
    assert g.diagnosis is not None
    doc = idleness_document(p.snapshot).model_dump()["gpus"][0]
    return g.diagnosis.verdict, doc, g.idle_seconds_total


def test_a_server_that_says_it_has_no_request_is_serving_idle_after_a_while() -> None:
    verdict, doc, idle = _verdict_and_idleness(_replay("h200-i-kernel-idle", _served([8000], 0.0, 0.0)))
    assert verdict == "serving_idle"
    assert doc["status"] == "idle" and doc["cause"] == "serving_idle"
    # until the server had said so for 10 s its idle time was serving (paused), then serving_idle
    assert idle["serving_idle"] > 0 and idle["serving"] > 0 and idle["held_idle"] == 0


@pytest.mark.parametrize(
    ("running", "waiting"),
    [(1.0, 0.0), (0.0, 3.0), (None, None)],  # requests running, requests waiting, a server that says nothing
)
def test_a_server_with_requests_or_that_says_nothing_is_serving_and_active(
    running: float | None, waiting: float | None
) -> None:
    verdict, doc, idle = _verdict_and_idleness(_replay("h200-i-kernel-idle", _served([8000], running, waiting)))
    assert verdict == "serving" and doc["status"] == "active"
    assert idle["serving_idle"] == 0 and idle["held_idle"] == 0 and idle["serving"] > 0


def test_a_server_that_says_no_request_while_its_gpu_runs_kernels_is_not_idle() -> None:
    """The tenant's word keeps its GPU active, never idles one that works: a server answering a request a second
    whose metrics say 0 stays serving, its idle time paused between its kernels."""
    verdict, doc, idle = _verdict_and_idleness(_replay("h200-i-http-1hz", _served([8080], 0.0, 0.0)))
    assert verdict == "serving" and doc["status"] == "active"
    assert idle["held_idle"] == 0 and idle["serving_idle"] == 0
