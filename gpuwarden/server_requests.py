"""What an inference server says of its own requests: requests running and waiting, read from the Prometheus text its
listening port serves at ``/metrics`` (vLLM, SGLang, Text Generation Inference and Triton export them).

A server gpuwarden found (gpuwarden.procinfo.server_ports) is asked at most every REQUESTS_REFRESH_SECONDS, in a
thread of its own so that a poll never waits on a tenant's server: ``RequestReader.latest`` answers what the last
read gave. Each read goes to 127.0.0.1 only (never off the host), follows no redirect, gives up after
REQUESTS_TIMEOUT_SECONDS and REQUESTS_MAX_BYTES, and is parsed by prometheus_client's own parser; only the numbers
of the metrics named in ENGINES are kept (never a label value). What the server says is its tenant's word: it
can keep its own GPU active, never make another job's GPU idle (gpuwarden.insight.analyzer uses it only for the
GPU the server's own process holds).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: Least seconds between two reads of one server's /metrics.
REQUESTS_REFRESH_SECONDS = 15.0
#: A read's whole time (connect, headers, body), in seconds.
REQUESTS_TIMEOUT_SECONDS = 2.0
#: A /metrics body larger than this is not read to its end: the server says nothing (a vLLM server's is ~30 KiB).
REQUESTS_MAX_BYTES = 4 * 2**20
#: A read that failed is tried again after this many seconds (a port that answers no HTTP, a server without /metrics).
REQUESTS_RETRY_SECONDS = 60.0

#: What each engine exports of its requests: (gauge of requests running, gauge of requests waiting, counters of
#: requests done). Sources: vLLM's production metrics (vllm:num_requests_running, vllm:num_requests_waiting,
#: vllm:request_success_total), SGLang's (sglang:num_running_reqs, sglang:num_queue_reqs), Text Generation
#: Inference's (tgi_batch_current_size, tgi_queue_size, tgi_request_count), Triton's (no gauge of requests running;
#: nv_inference_pending_request_count, nv_inference_request_success and _failure). A gauge is one moment of the
#: interval between two reads; the counters say whether a request ran at any moment of it.
ENGINES: tuple[tuple[str | None, str, tuple[str, ...]], ...] = (
    ("vllm:num_requests_running", "vllm:num_requests_waiting", ("vllm:request_success",)),
    ("sglang:num_running_reqs", "sglang:num_queue_reqs", ()),
    ("tgi_batch_current_size", "tgi_queue_size", ("tgi_request_count",)),
    (None, "nv_inference_pending_request_count", ("nv_inference_request_success", "nv_inference_request_failure")),
)


@dataclass(frozen=True, slots=True)
class Requests:
    """A server's requests at one read: ``running`` and ``waiting`` (each summed over its models; a request done since
    the previous read counts one running: it ran between the reads), ``done_total`` (its counters of requests done,
    for the next read to compare; None where the engine has none) and ``at`` (time.time() of the read)."""

    running: float
    waiting: float
    at: float
    done_total: float | None = None

    @property
    def active(self) -> bool:
        """A request runs or waits, or ran since the previous read."""
        return self.running > 0 or self.waiting > 0


def parse_requests(text: str, previous: Requests | None = None, now: float | None = None) -> Requests | None:
    """The requests a server's Prometheus text exposition ``text`` reports (ENGINES), or None when it reports none of
    them or cannot be parsed (not Prometheus text). Values that are not finite non-negative numbers are ignored. When
    its counters of requests done grew since ``previous``, at least one request counts as running (it ran between the
    two reads, which the gauges, each one moment, may both have missed). Raises nothing."""
    sums = _sums(text)
    if sums is None:
        return None
    at = time.time() if now is None else now
    for running, waiting, done in ENGINES:
        if (running is None or running not in sums) and waiting not in sums:
            continue
        run = sums.get(running, 0.0) if running is not None else 0.0
        total = sum(sums[n] for n in done if n in sums) if any(n in sums for n in done) else None
        if total is not None and previous is not None and previous.done_total is not None:
            if total > previous.done_total:
                run = max(run, 1.0)
        return Requests(running=run, waiting=sums.get(waiting, 0.0), at=at, done_total=total)
    return None


#: The names of every engine's series (ENGINES).
_NAMES = frozenset(n for running, waiting, done in ENGINES for n in (running, waiting, *done) if n is not None)


def _sums(text: str) -> dict[str, float] | None:
    """Each series of _NAMES in the exposition ``text`` summed over its labels (finite non-negative values only),
    or None when ``text`` is not Prometheus text."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")  # the parser names a counter's samples NAME_total
                if name in _NAMES and math.isfinite(sample.value) and sample.value >= 0:
                    sums[name] = sums.get(name, 0.0) + sample.value
    except Exception:  # noqa: BLE001 - the tenant's text: whatever the parser rejects says nothing
        return None
    return sums


def fetch(client: httpx.Client, port: int) -> str | None:
    """The body of ``http://127.0.0.1:PORT/metrics`` (at most REQUESTS_MAX_BYTES, a 200 answer, no redirect
    followed, within REQUESTS_TIMEOUT_SECONDS in all: a server that sends a byte at a time is left), or None. Raises
    nothing."""
    deadline = time.monotonic() + REQUESTS_TIMEOUT_SECONDS
    try:
        with client.stream("GET", f"http://127.0.0.1:{port}/metrics") as r:
            if r.status_code != 200:
                return None
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > REQUESTS_MAX_BYTES or time.monotonic() > deadline:
                    return None
            return body.decode("utf-8", errors="replace")
    except (httpx.HTTPError, OSError, ValueError):
        return None


class RequestReader:
    """Reads the requests of servers in a thread of its own. ``latest(pid, ports)`` returns the last Requests read of
    that process's server (from the first of its ports that answered), None before the first read or when none of its
    ports says; it asks for a read when the last is REQUESTS_REFRESH_SECONDS old (REQUESTS_RETRY_SECONDS after a
    failed one). ``forget_except(pids)`` drops the processes gone; ``close()`` stops the thread. Raises nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: dict[int, Requests | None] = {}
        self._due: dict[int, float] = {}
        self._queue: queue.SimpleQueue[tuple[int, tuple[int, ...]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def latest(self, pid: int, ports: list[int]) -> Requests | None:
        """What the server of ``pid`` listening on ``ports`` last said (see the class doc)."""
        now = time.monotonic()
        with self._lock:
            got = self._got.get(pid)
            if ports and now >= self._due.get(pid, 0.0):
                self._due[pid] = now + REQUESTS_RETRY_SECONDS  # until the read answers
                self._start()
                self._queue.put((pid, tuple(ports)))
        return got

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpuwarden-server-requests", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        timeout = httpx.Timeout(REQUESTS_TIMEOUT_SECONDS)
        with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                pid, ports = item
                with self._lock:
                    previous = self._got.get(pid)
                got = None
                for port in ports:
                    text = fetch(client, port)
                    got = parse_requests(text, previous) if text is not None else None
                    if got is not None:
                        break
                with self._lock:
                    if pid in self._due:  # not forgotten meanwhile
                        self._got[pid] = got
                        if got is not None:
                            self._due[pid] = time.monotonic() + REQUESTS_REFRESH_SECONDS

    def forget_except(self, live: set[int]) -> None:
        """Drop what is known of every process not in ``live``."""
        with self._lock:
            for pid in [p for p in self._due if p not in live]:
                self._due.pop(pid, None)
                self._got.pop(pid, None)

    def close(self) -> None:
        """Stop the thread (after the read in flight)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(REQUESTS_TIMEOUT_SECONDS + 1.0)
            self._thread = None
