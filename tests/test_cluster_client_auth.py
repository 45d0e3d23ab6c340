"""``top`` and ``report`` against a Prometheus API behind mutual TLS, a bearer token and a tenant header (as Mimir,
Cortex or a proxy in front of Prometheus require): a stdlib HTTPS server that answers only a request carrying all
three. Durations in Prometheus's own grammar (``1h30m``)."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pki import PKI, make_pki

from gpuwarden.cli import main
from gpuwarden.cluster.durations import seconds

TOKEN = "t0ken-for-the-test"
SEEN: list[dict[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        SEEN.append(dict(self.headers))
        ok = self.headers.get("authorization") == f"Bearer {TOKEN}" and self.headers.get("x-scope-orgid") == "team-a"
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory)


@pytest.fixture(scope="module")
def server(pki: PKI) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca.pem))
    ctx.load_cert_chain(str(pki.server.cert), str(pki.server.key))
    ctx.verify_mode = ssl.CERT_REQUIRED
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _top(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["top", "--range", "1h30m", "--step", "1m", "--json", "--timeout", "20", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _auth(pki: PKI, token: Path) -> list[str]:
    return ["--prometheus.ca-file", str(pki.ca.pem), "--prometheus.cert-file", str(pki.client.cert),
            "--prometheus.key-file", str(pki.client.key), "--prometheus.bearer-token-file", str(token),
            "--header", "X-Scope-OrgID: team-a"]  # fmt: skip


def test_top_through_mutual_tls_a_token_and_a_tenant_header(
    server: str, pki: PKI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    SEEN.clear()
    code, out, err = _top(capsys, "--prometheus", server, *_auth(pki, token))
    assert code == 0, err
    assert json.loads(out)["jobs"] == [] and SEEN and all(h["X-Scope-OrgID"] == "team-a" for h in SEEN)


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("--prometheus.cert-file", "needs both --prometheus.cert-file and --prometheus.key-file"),
        ("--prometheus.ca-file", "cannot reach"),  # the test CA is not the system's: verification fails
        ("--header", "401"),
        ("--prometheus.bearer-token-file", "401"),
    ],
)
def test_without_each_credential_one_line_and_exit_1(
    server: str, pki: PKI, tmp_path: Path, capsys: pytest.CaptureFixture[str], drop: str, message: str
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    args = _auth(pki, token)
    i = args.index(drop)
    del args[i : i + 2]
    code, _, err = _top(capsys, "--prometheus", server, *args)
    assert code == 1 and err.count("\n") == 1 and message in err, err


def test_a_token_file_is_never_echoed(
    server: str, pki: PKI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad"
    bad.write_text("secret-part-1\nsecret-part-2\n")
    args = _auth(pki, bad)
    code, _, err = _top(capsys, "--prometheus", server, *args)
    assert code == 1 and "one line of printable text" in err and "secret" not in err, err
    args[args.index(str(bad))] = str(tmp_path / "absent")
    code, _, err = _top(capsys, "--prometheus", server, *args)
    assert code == 1 and "cannot read the bearer token file" in err, err


@pytest.mark.parametrize("bad", ["X-Scope-OrgID", "bad header: x", "X: a\x1b[2Jb", ": v"])
def test_a_header_that_http_cannot_send_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["top", "--prometheus", "http://127.0.0.1:1", "--header", bad])
    assert exc.value.code == 2 and "expects 'NAME: VALUE'" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "secs"), [("1h30m", 5400), ("1d12h", 129600), ("90m", 5400), ("1m30s", 90)])
def test_prometheus_durations(text: str, secs: float) -> None:
    assert seconds(text) == secs


@pytest.mark.parametrize("text", ["30m1h", "1h1h", "1.5h", "0m", "5", "", "1H"])
def test_durations_prometheus_refuses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        seconds(text)
