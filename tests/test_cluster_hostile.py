"""``top`` and ``report`` against a hostile or broken Prometheus API (a stdlib HTTP server answering what each case
says): every answer ends in exit 0 with output, or exit 1 with one line on standard error - never a traceback; a
slow drip ends at ``--timeout``; a huge answer is refused before it is held; ``--json`` is strict JSON; nothing
from the answer reaches the terminal as an escape sequence or Rich markup."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import gzip_bomb

from gpuwarden.cli import main
from gpuwarden.cluster.promapi import MAX_ANSWER_BYTES, MAX_SAMPLES

HOSTILE = "[/][link=file:///etc/passwd]x[/link]\x1b]0;pwned\x07\x1b[2J"


def _vector(*samples: tuple[Mapping[str, object], object]) -> bytes:
    result = [{"metric": m, "value": [1.0, v]} for m, v in samples]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


LABELS = {"instance": HOSTILE, "gpu": "0", "job_id": HOSTILE, "job_kind": "slurm", "node": HOSTILE,
          "hostname": HOSTILE, "cause": "input_starved", "reason": "input_starved", "currency": HOSTILE}  # fmt: skip

#: case -> (HTTP status, body)
ANSWERS: dict[str, tuple[int, bytes]] = {
    "not-json": (200, b"hello"),
    "html-500": (500, b"<html>oops</html>"),
    "json-list": (200, b"[]"),
    "no-data": (200, b'{"status": "success"}'),
    "data-string": (200, b'{"status": "success", "data": "x"}'),
    "result-string": (200, b'{"status": "success", "data": {"resultType": "vector", "result": "x"}}'),
    "result-numbers": (200, b'{"status": "success", "data": {"resultType": "vector", "result": [1, 2]}}'),
    "value-missing": (200, b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}'),
    "metric-list": (
        200,
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":[],"value":[1,"1"]}]}}',
    ),
    "label-number": (200, _vector(({"instance": 1}, "1"))),
    "value-number": (200, _vector(({}, 1))),
    "value-text": (200, _vector(({}, "abc"))),
    "value-short": (200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1]}]}}'),
    "nan-literal": (
        200,
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,NaN]}]}}',
    ),
    "nested": (200, b"[" * 100_000 + b"]" * 100_000),
    "error-markup": (400, json.dumps({"status": "error", "error": HOSTILE * 3}).encode()),
    "error-not-text": (400, b'{"status": "error", "error": {"a": [1]}}'),
    "matrix": (200, b'{"status": "success", "data": {"resultType": "matrix", "result": []}}'),
    "kind-markup": (200, json.dumps({"status": "success", "data": {"resultType": HOSTILE, "result": []}}).encode()),
    "scalar": (200, b'{"status": "success", "data": {"resultType": "scalar", "result": [1, "5"]}}'),
    "empty": (200, _vector()),
    "infinite": (
        200,
        _vector(
            (LABELS, "+Inf"),
            ({**LABELS, "gpu": "1"}, "-Inf"),
            ({**LABELS, "gpu": "2"}, "1e999"),
            ({**LABELS, "gpu": "3"}, "60"),
        ),
    ),
    "hostile-labels": (200, _vector((LABELS, "3600"), ({**LABELS, "gpu": "1"}, "0.5"))),
    "long-id": (200, _vector(({**LABELS, "job_id": "j" * 100_000, "instance": "i" * 100_000}, "3600"))),
    "unauthorized": (401, b"no"),
}
#: Answers that end in exit 2 (report cannot tell which job): a node-local id on two nodes, one named by 10 kB.
AMBIGUOUS: dict[str, tuple[int, bytes]] = {
    "two-nodes": (
        200,
        _vector(
            ({**LABELS, "instance": HOSTILE + "a" * 10_000, "job_scope": "node"}, "3600"),
            ({**LABELS, "instance": HOSTILE + "b", "job_scope": "node"}, "60"),
        ),
    ),  # fmt: skip
}


#: case -> the Content-Encoding its answer comes in
ENCODED = {"gzip-bomb": "gzip", "brotli": "br", "gzip-fine": "gzip"}
BOMB = gzip_bomb(200 << 20)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def _drip(self, byte: bytes) -> None:
        """Send ``byte`` once a second for ten minutes, or until the client leaves."""
        try:
            for _ in range(600):
                self.wfile.write(byte)
                self.wfile.flush()
                time.sleep(1)
        except OSError:
            return

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        case = self.path.split("/")[1]
        if case == "drip-headers":  # the status line, then a header a byte a second: no read ever waits long
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self._drip(b"X")
            return
        if case == "drip":  # a valid start, then a byte a second for ever
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self._drip(b" ")
            return
        if case in ("huge", "huge-bytes", "big"):  # tiny series past MAX_SAMPLES; 2 kB ones past the bytes; 30 MiB
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            if case == "big":
                self._big()
                return
            item = b'{"metric":{"instance":"x"},"value":[1,"1"]},'
            if case == "huge-bytes":
                item = b'{"metric":{"instance":"' + b"x" * 2000 + b'"},"value":[1,"1"]},'
            try:
                self.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
                for _ in range(2 * MAX_ANSWER_BYTES // len(item) // 1000 + 1):
                    self.wfile.write(item * 1000)
                self.wfile.write(b'{"metric":{},"value":[1,"1"]}]}}')
            except OSError:
                return
            return
        encoding = ENCODED.get(case)
        if encoding is not None:  # 200 KB inflating to 200 MiB; a coding not asked for; a fine answer in gzip
            status, body = 200, BOMB if case == "gzip-bomb" else gzip.compress(_vector((LABELS, "60")))
        else:
            status, body = ANSWERS[case] if case in ANSWERS else AMBIGUOUS[case]
        self.send_response(status)
        self.send_header("content-type", "application/json")
        if encoding is not None:
            self.send_header("content-encoding", encoding)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _big(self) -> None:
        """A valid answer of 30 MiB (under MAX_ANSWER_BYTES) in 90,000 series (under MAX_SAMPLES), each with the
        labels of a GPU's counter and a unique instance, written as it goes."""
        self.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        labels = ',"cluster":"c1","job_id":"12345","cause":"input_cpu","gpu":"3","pad":"' + "p" * 170 + '"'
        for i in range(90_000):
            item = '%s{"metric":{"__name__":"gpu_idle_seconds_total","instance":"node%d:10400"%s},"value":[1,"%d.5"]}'
            self.wfile.write((item % ("," if i else "", i, labels, i)).encode())
        self.wfile.write(b"]}}")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


#: The child that parses the 30 MiB answer: prints the samples' count, the 8th sample and tracemalloc's peak.
_PARSE_BIG = """
import sys, tracemalloc
from gpuwarden.cluster.promapi import Prometheus
client = Prometheus(sys.argv[1], timeout=1800)  # a memory bound, not a time one: any load finishes
tracemalloc.start()
samples = client.query("gpu_idle_seconds_total")
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(len(samples), samples[7].value, samples[7].labels["instance"], peak)
"""


@pytest.mark.e2e  # 20 s on a quiet core: a 30 MiB answer parsed in a child process
def test_a_valid_answer_of_30_mib_is_parsed_within_a_memory_bound(server: str) -> None:
    """90,000 series in 30 MiB, under both caps: every sample is read while Python's allocations peak under 80 MiB
    (the answer joined whole and parsed by json.loads peaked at 640 MB for its tree; now it is parsed chunk by chunk
    as read, each label name and value kept once). tracemalloc counts the allocations, the same on any machine. The
    parse runs in a child process of its own: on a loaded or small machine whatever befalls it (slow under
    tracemalloc, killed for memory) fails this test, not the test worker and the session with it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PARSE_BIG, f"{server}/big"], capture_output=True, text=True,
                          timeout=1800, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    count, value, instance, peak = done.stdout.split()
    assert int(count) == 90_000 and float(value) == 7.5 and instance == "node7:10400"
    assert int(peak) < 80 * 2**20, int(peak) / 2**20


@pytest.mark.parametrize("case", [*ANSWERS, "huge", "huge-bytes", *ENCODED])
@pytest.mark.parametrize(
    "command", [["top"], ["top", "--json"], ["report", "--job", HOSTILE], ["report", "--json", "--job", "x"]]
)
def test_every_answer_is_output_or_one_line(
    server: str, case: str, command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwarden.cluster import promapi

    if case == "huge":  # the cap's path, at a tenth of the series to parse first (the 30 MiB test runs in e2e)
        monkeypatch.setattr(promapi, "MAX_SAMPLES", MAX_SAMPLES // 10)
    rc, out, err = _run(capsys, *command, "--prometheus", f"{server}/{case}", "--timeout", "20")
    assert rc in (0, 1), (rc, err)
    assert "\x1b" not in out + err and "\x07" not in out + err  # no escape sequence reaches the terminal
    if rc == 1:  # one line: the error on standard error, or "no gpuwarden data" on standard output
        line = err.strip() or out.strip()
        assert line and line.count("\n") == 0 and "Traceback" not in err, (out, err)
    if rc == 0 and "--json" in command:
        json.loads(out, parse_constant=lambda token: pytest.fail(f"{token} is not JSON"))
    if case == "huge":
        assert rc == 1 and f"more than {MAX_SAMPLES // 10} series" in err
    if case in ("huge-bytes", "gzip-bomb"):
        assert rc == 1 and f"more than {MAX_ANSWER_BYTES} bytes" in err
    if case == "brotli":
        assert rc == 1 and "came in an encoding gpuwarden does not read: 'br'" in err
    if case == "gzip-fine" and command == ["top", "--json"]:
        assert rc == 0 and json.loads(out)["gpus"]
    if case == "long-id" and "--json" not in command:  # a table shows 512 characters of a value, the cut said
        assert max(map(len, out.splitlines()), default=0) < 2_000 and ("…(+" in out or rc == 1), out[:300]
    if case == "long-id" and command == ["top", "--json"]:  # JSON keeps it whole
        assert rc == 0 and "j" * 100_000 in out
    if case in ("hostile-labels", "infinite") and command == ["top"]:
        assert rc == 0 and "[/][link" in out  # the markup shown as text (the table may fold the rest)


@pytest.mark.parametrize("case", ["drip", "drip-headers"])
def test_a_dripping_answer_ends_at_the_timeout(server: str, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A body, or the status line and headers, dripped a byte a second: each read is quick, the whole is not; the
    command ends at --timeout either way."""
    start = time.monotonic()
    rc, _, err = _run(capsys, "top", "--prometheus", f"{server}/{case}", "--timeout", "2")
    took = time.monotonic() - start
    assert rc == 1 and "no answer within --timeout 2 s" in err and err.count("\n") == 1
    assert took < 5, took  # the deadline plus at most one read in progress (a byte a second)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["top", "--prometheus", "http://127.0.0.1:1", "--timeout", value])
    assert exc.value.code == 2 and "--timeout" in capsys.readouterr().err


def test_an_ambiguous_job_is_one_short_line_whatever_its_nodes_are_called(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node-local id seen on two nodes whose instance labels carry escape sequences, markup and 10 kB: report
    exits 2 with one line that shows them escaped and cut, never kilobytes."""
    rc, out, err = _run(capsys, "report", "--job", HOSTILE, "--prometheus", f"{server}/two-nodes", "--timeout", "20")
    assert rc == 2 and out == "" and err.count("\n") == 1, (rc, err[:300])
    assert "seen on 2 nodes" in err and "\x1b" not in err and "\x07" not in err
    assert len(err) < 1000 and "…(+" in err
