"""What an answer may cost a command (gpuwarden.cluster.bounds): bodies inflated as httpx inflates them, in bounded
steps and never past the bound (a gzip bomb refused in a few MiB); encodings not asked for refused; a list's members
one at a time within their bounds; and a whole command's requests within one deadline. Plus the hostile Kubernetes API
server: a node list dripped a byte a second, a gzip bomb, and a list of 10 MB against ``drain``."""

from __future__ import annotations

import gzip
import json
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from helpers import gzip_bomb

from gpuwarden.cluster.bounds import (
    DECODE_BYTES,
    MAX_DEPTH,
    AnswerTooLarge,
    Deadline,
    DeadlineExceeded,
    decoded,
    listed,
)

RESULT = [{"metric": {"instance": f"node{i}:10400", "gpu": str(i % 8)}, "value": [1.5, str(i)]} for i in range(3000)]
BODY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": RESULT}}).encode()


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODED = {
    "identity": BODY,
    "gzip": gzip.compress(BODY),
    "deflate": zlib.compress(BODY),
    "deflate-raw": _raw_deflate(BODY),
}


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
@pytest.mark.parametrize("encoding", list(ENCODED))
def test_bodies_are_inflated_as_httpx_inflates_them(encoding: str, size: int) -> None:
    header = encoding.removesuffix("-raw")
    sent = ENCODED[encoding]
    theirs = httpx.Response(200, headers={"content-encoding": header}, content=sent).read()  # httpx's own decoders
    ours = b"".join(decoded(_chunks(sent, size), header, 10 * len(BODY), "GET /x"))
    assert ours == theirs == BODY


BOMB = gzip_bomb(200 << 20)  # 200 MiB inflated


def test_a_gzip_bomb_is_refused_at_the_bound_in_a_few_mib() -> None:
    assert len(BOMB) < 400_000
    tracemalloc.start()
    try:
        with pytest.raises(AnswerTooLarge, match=r"GET /x answered more than 33554432 bytes"):
            for _ in decoded(_chunks(BOMB, 65536), "gzip", 32 << 20, "GET /x"):
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * DECODE_BYTES + (1 << 20), peak  # one chunk read and one step inflated at a time


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip", "compress", "x-gzip"])
def test_an_encoding_not_asked_for_is_refused(encoding: str) -> None:
    with pytest.raises(AnswerTooLarge, match="an encoding gpuwarden does not read"):
        next(decoded([b"x"], encoding, 100, "GET /x"))


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_body_that_is_not_its_encoding_is_refused(encoding: str) -> None:
    with pytest.raises(AnswerTooLarge, match=f"not the {encoding} it says it is"):
        list(decoded([b"plain text, not compressed at all"], encoding, 1000, "GET /x"))


def test_an_identity_body_past_the_bound_is_refused() -> None:
    with pytest.raises(AnswerTooLarge, match="more than 10 bytes"):
        list(decoded([b"12345", b"678901"], None, 10, "GET /x"))


def _list(items: list[object]) -> bytes:
    return json.dumps({"kind": "NodeList", "metadata": {"resourceVersion": "1"}, "items": items}).encode()


@pytest.mark.parametrize("size", [1, 5, 16384, 1 << 20])
def test_a_lists_members_come_one_at_a_time_as_json_loads_reads_them(size: int) -> None:
    items: list[object] = [{"metadata": {"name": f"n{i}", "labels": {"a": "b"}}, "spec": {"taints": [{"k": i}]}}
                           for i in range(50)] + [7, "text", [1, [2]]]  # fmt: skip
    assert list(listed(_chunks(_list(items), size), "items", 1000, "GET /l")) == items


def test_a_list_of_10_mb_costs_one_member_at_a_time() -> None:
    node = {"metadata": {"name": "n", "labels": {f"l{j}": "v" * 40 for j in range(40)}}, "status": {"images": [
        {"names": [f"registry.example/image-{j}@sha256:" + "0" * 64], "sizeBytes": 1} for j in range(40)]}}  # fmt: skip
    body = _list([node] * 1500)
    assert len(body) > 10 << 20
    tracemalloc.start()
    try:
        count = sum(1 for _ in listed(_chunks(body, 65536), "items", 1 << 20, "GET /l"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 1500 and peak < 4 << 20, peak / 2**20  # json.loads of it whole: over 100 MiB


def test_a_member_past_its_bound_and_nesting_past_the_depth_are_refused() -> None:
    with pytest.raises(AnswerTooLarge, match="a member of 'items' of more than 100 bytes"):
        list(listed([_list([{"metadata": {"name": "x" * 200}}])], "items", 100, "GET /l"))
    deep = b'{"items": [' + b"[" * (MAX_DEPTH + 5) + b"]" * (MAX_DEPTH + 5) + b"]}"
    with pytest.raises(AnswerTooLarge, match=f"nested deeper than {MAX_DEPTH}"):
        list(listed([deep], "items", 1000, "GET /l"))
    with pytest.raises(ValueError, match="GET /l: not JSON"):
        list(listed([b'{"items": [1, 2'], "items", 1000, "GET /l"))
    with pytest.raises(ValueError, match="not JSON"):
        list(listed([b"<html>"], "items", 1000, "GET /l"))


def test_the_deadline_bounds_the_calls_together_and_hands_back_results_and_errors() -> None:
    deadline = Deadline(0.5)
    assert deadline.call(lambda left: left > 0, "first") is True
    missing: dict[str, int] = {}
    with pytest.raises(KeyError):
        deadline.call(lambda left: missing["key"], "second")
    with pytest.raises(DeadlineExceeded, match=r"^slow: no answer within --timeout 0.5 s$"):
        deadline.call(lambda left: time.sleep(30), "slow")
    with pytest.raises(DeadlineExceeded, match="after: no answer"):  # spent: nothing more is sent
        deadline.call(lambda left: 1, "after")


def test_a_request_whose_own_timeout_fires_at_the_deadline_is_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded machine the request's per-read timeout (the seconds left) can fire before the wait for it ends:
    the command still says the deadline passed, not the client library's timeout. The clock is the test's: the
    deadline is 0.3 s away when the request starts and past once it has failed."""
    import gpuwarden.cluster.bounds as bounds

    clock = iter([0.0, 0.0, 1.0, 1.0])  # Deadline(), call's left(), then after the request failed
    monkeypatch.setattr(bounds, "monotonic", lambda: next(clock))
    deadline = Deadline(0.3)

    def times_out(left: float) -> None:
        raise TimeoutError("timed out")  # what httpx raises when its read timeout of ``left`` fires

    with pytest.raises(DeadlineExceeded, match=r"^GET /x: no answer within --timeout 0.3 s$"):
        deadline.call(times_out, "GET /x")


# --- a hostile Kubernetes API server against `drain --scheduler kubernetes` -----------------------------------------


class _Api(BaseHTTPRequestHandler):
    """A Kubernetes API server answering ``GET /api/v1/nodes`` as the path's first part says (behind
    ``--kube-api http://HOST/CASE``)."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        case = self.path.split("/")[1]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if case == "drip":  # a valid start, then a byte a second for ever
            self.end_headers()
            try:
                self.wfile.write(b'{"kind": "NodeList", "items": [')
                for _ in range(600):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:
                return
            return
        body = BOMB if case == "bomb" else _list([{"metadata": {"name": f"gpu-{i}"}} for i in range(3)])
        if case == "bomb":
            self.send_header("content-encoding", "gzip")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_api_servers_hostile_answers_end_in_one_line(api: str) -> None:
    from gpuwarden.cluster.kube import MAX_BYTES, KubeApi

    assert set(KubeApi(f"{api}/fine").nodes()) == {"gpu-0", "gpu-1", "gpu-2"}
    with pytest.raises(RuntimeError, match=f"GET /api/v1/nodes answered more than {MAX_BYTES} bytes"):
        KubeApi(f"{api}/bomb").nodes()
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^GET /api/v1/nodes: no answer within --timeout 1 s$"):
        KubeApi(f"{api}/drip", deadline=Deadline(1.0)).nodes()
    assert time.monotonic() - began < 30  # the deadline, not the drip's ten minutes (a bound, not a timing)
