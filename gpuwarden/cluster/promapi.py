"""A small client of the Prometheus HTTP API (``/api/v1/query``), which Thanos, Mimir, VictoriaMetrics and Cortex
speak too: ``top`` and ``report`` ask any of them.

Only instant queries are used; ranges are written into the PromQL (subqueries), so one request answers one
question and the answer is a plain vector.
"""

from __future__ import annotations

import json
import math
import ssl
import threading
from dataclasses import dataclass
from time import monotonic

import httpx

from gpuwarden.terminal import visible
from gpuwarden.urls import redacted


class PrometheusError(Exception):
    """A query could not be answered: the server is unreachable, refuses, or is not a Prometheus API. The message is
    one line meant for the user."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and value (a finite float: NaN and infinite samples are dropped)."""

    labels: dict[str, str]
    value: float


#: The largest answer read (bytes): a fleet's vector of a few thousand series is a few MB; past this the answer is
#: refused rather than held (a 100 MB answer parsed whole took ~1 GB).
MAX_ANSWER_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ClientTls:
    """How to authenticate to the Prometheus API and check its certificate: ``ca_file`` (PEM; None: the system's
    CAs), a client certificate ``cert_file`` with its ``key_file`` (mutual TLS), and a ``bearer_token_file`` whose
    one line is sent as ``Authorization: Bearer`` (Prometheus's own ``authorization.credentials_file``)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    bearer_token_file: str | None = None

    def context(self) -> ssl.SSLContext:
        """The SSL context to verify with; raises PrometheusError (one line) for a file that cannot be read."""
        if bool(self.cert_file) != bool(self.key_file):
            raise PrometheusError("a client certificate needs both --prometheus.cert-file and --prometheus.key-file")
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file and self.key_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise PrometheusError(f"cannot load the TLS files: {visible(exc)}") from None
        return ctx


def _token(path: str) -> str:
    """The bearer token in ``path``: its first line, stripped; raises PrometheusError (never echoing the token)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read(65536).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise PrometheusError(f"cannot read the bearer token file {visible(path)}: {type(exc).__name__}") from None
    if not token or "\n" in token or not token.isprintable():
        raise PrometheusError(f"the bearer token file {visible(path)} must hold one line of printable text")
    return token


class Prometheus:
    """Instant queries against ``url`` (``http://HOST:9090``, or a Thanos/Mimir query front end with its path prefix,
    e.g. ``http://mimir/prometheus``; credentials as ``http://USER:PASSWORD@HOST``).

    ``timeout`` (seconds) bounds all the queries of this client together, from its creation: a server that answers
    slowly, or drips its answer a byte at a time, ends in PrometheusError once it is spent. ``headers`` are sent
    with every request (e.g. ``X-Scope-OrgID`` for Mimir/Cortex tenants).
    """

    def __init__(
        self, url: str, timeout: float = 30.0, headers: dict[str, str] | None = None, tls: ClientTls | None = None
    ) -> None:
        base = url if "://" in url else f"http://{url}"
        self.base = base.rstrip("/")
        self.timeout = timeout
        self._deadline = monotonic() + timeout
        tls = tls or ClientTls()
        sent = dict(headers or {})
        if tls.bearer_token_file:
            sent["Authorization"] = f"Bearer {_token(tls.bearer_token_file)}"
        try:
            self._client = httpx.Client(base_url=self.base, timeout=timeout, headers=sent, verify=tls.context())
        except (httpx.InvalidURL, ValueError):
            raise PrometheusError(f"not a usable URL: {redacted(url)}") from None

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def query(self, promql: str, time: float | None = None) -> list[Sample]:
        """Evaluate ``promql`` at ``time`` (Unix seconds; None: now) and return the vector's finite samples (NaN and
        infinite values are not readings: dropped).

        Raises PrometheusError (one line) when the server cannot be reached, answers an HTTP error or a PromQL
        error, answers something other than a vector (a scalar result is returned as one sample without labels) or
        malformed JSON, answers more than MAX_ANSWER_BYTES, or the client's ``timeout`` is spent.
        """
        params = {"query": promql}
        if time is not None:
            params["time"] = f"{time:.3f}"
        target = f"{redacted(self.base)}/api/v1/query"  # as printed: never the password
        status, raw = self._post(target, params)
        if status in (401, 403):
            raise PrometheusError(f"{target} refused the request (HTTP {status}): credentials in the URL?")
        try:
            body = json.loads(raw, parse_constant=_not_json)
        except (ValueError, RecursionError):
            raise PrometheusError(f"{target} answered HTTP {status}, not the Prometheus API") from None
        if not isinstance(body, dict) or "status" not in body:
            raise PrometheusError(f"{target} answered HTTP {status}, not the Prometheus API")
        if body.get("status") != "success":
            raise PrometheusError(f"{target}: {visible(str(body.get('error', f'HTTP {status}'))[:300])}")
        data = body.get("data")
        data = data if isinstance(data, dict) else {}
        kind, result = data.get("resultType"), data.get("result")
        try:
            if kind == "scalar" and isinstance(result, list):
                return [Sample({}, v) for v in (_value(result),) if math.isfinite(v)]
            if kind != "vector" or not isinstance(result, list):
                raise PrometheusError(f"{target} answered a {visible(str(kind)[:40])}, not a vector")
            out = []
            for r in result:
                value = _value(r["value"])
                labels = r.get("metric", {})
                if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                    raise ValueError("labels")
                if math.isfinite(value):
                    out.append(Sample(dict(labels), value))
            return out
        except (KeyError, TypeError, ValueError, IndexError):
            raise PrometheusError(f"{target} answered a malformed vector") from None

    def _post(self, target: str, params: dict[str, str]) -> tuple[int, bytes]:
        """POST the query; return (HTTP status, body) read within the deadline and MAX_ANSWER_BYTES. The exchange
        runs in a thread the caller waits on until the deadline: httpx's timeouts bound each read, not the whole
        request, so a server that drips its status line and headers a byte at a time would outlast them."""
        left = self._deadline - monotonic()
        if left <= 0:
            raise PrometheusError(f"{target}: no answer within --timeout {self.timeout:g} s")
        answer: list[tuple[int, bytes] | BaseException] = []

        def exchange() -> None:
            try:
                answer.append(self._exchange(target, params, left))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                answer.append(exc)

        worker = threading.Thread(target=exchange, name="gpuwarden-prometheus-query", daemon=True)
        worker.start()
        worker.join(left)
        if not answer:  # still reading: left behind (a daemon thread), the command ends with the error
            raise PrometheusError(f"{target}: no answer within --timeout {self.timeout:g} s")
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]

    def _exchange(self, target: str, params: dict[str, str], left: float) -> tuple[int, bytes]:
        """The request itself: (HTTP status, body); raises PrometheusError (one line)."""
        chunks, size = [], 0
        try:
            with self._client.stream("POST", "/api/v1/query", data=params, timeout=left) as resp:
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise PrometheusError(f"{target} answered more than {MAX_ANSWER_BYTES} bytes")
                    if monotonic() > self._deadline:
                        raise PrometheusError(f"{target}: no answer within --timeout {self.timeout:g} s")
                    chunks.append(chunk)
                return resp.status_code, b"".join(chunks)
        except httpx.TimeoutException:
            raise PrometheusError(f"{target}: no answer within --timeout {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach {target}: {visible(exc) or type(exc).__name__}") from None


def _not_json(token: str) -> float:
    raise ValueError(f"{token} is not JSON")


def _value(pair: object) -> float:
    """A sample's ``[time, "value"]`` pair as its float value (Prometheus writes values as strings: "+Inf" too)."""
    if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
        raise ValueError("not a sample")
    return float(pair[1])
