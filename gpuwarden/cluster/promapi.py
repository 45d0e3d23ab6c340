"""A small client of the Prometheus HTTP API (``/api/v1/query`` and ``/api/v1/query_range``), which Thanos, Mimir,
VictoriaMetrics and Cortex speak too: ``top``, ``report`` and ``reclaim`` ask any of them.

``top`` and ``report`` use instant queries only; ranges are written into the PromQL (subqueries), so one request
answers one question and the answer is a plain vector. ``reclaim --report`` asks the same instant question at every
tick of a range, which is what a range query is (``query_range``: a matrix, the question's vector at each step).
The answer is parsed as it arrives (ijson's push parser over each chunk read), so neither its bytes nor a tree of
all its JSON are ever held: what stays is the samples, at most MAX_SAMPLES of them (a matrix: points).
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import ijson  # type: ignore[import-untyped]

from gpuwarden.cluster.bounds import AnswerTooLarge, Deadline, DeadlineExceeded, decoded
from gpuwarden.terminal import redacted, visible, why


class PrometheusError(Exception):
    """A query could not be answered: the server is unreachable, refuses, or is not a Prometheus API. The message is
    one line meant for the user."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector: its labels and value (a finite float: NaN and infinite samples are dropped)."""

    labels: dict[str, str]
    value: float


#: The largest answer read (bytes): a fleet's vector of a few thousand series is a few MB; past this the answer is
#: refused rather than read on (a 100 MB answer parsed whole took ~1 GB).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
#: The most series one answer may hold: the queries of ``top`` and ``report`` give one series per GPU, job or node of
#: the fleet (a fleet of 10,000 GPUs: 10,000); past this the answer is refused. Each sample kept costs about 300
#: bytes, so an answer stays within about 30 MB whatever it sends (a 30 MiB answer of tiny series, parsed whole by
#: json.loads, took 640 MB).
MAX_SAMPLES = 100_000


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
        except (OSError, ssl.SSLError) as exc:
            raise PrometheusError(f"cannot load --prometheus.ca-file {visible(self.ca_file)}: {why(exc)}") from None
        if self.cert_file and self.key_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                pair = f"--prometheus.cert-file {visible(self.cert_file)} with --prometheus.key-file"
                raise PrometheusError(f"cannot load {pair} {visible(self.key_file)}: {why(exc)}") from None
        return ctx


def _token(path: str) -> str:
    """The bearer token in ``path``: its first line, stripped; raises PrometheusError (never echoing the token)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read(65536).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise PrometheusError(f"cannot read the bearer token file {visible(path)}: {why(exc)}") from None
    if not token or "\n" in token or not token.isprintable():
        raise PrometheusError(f"the bearer token file {visible(path)} must hold one line of printable text")
    return token


class InstantQueries(Protocol):
    """What the accounting (gpuwarden.cluster.usage.Accounting) asks of a Prometheus: instant queries. A Prometheus
    client is one; gpuwarden.cluster.stepped.SteppedQueries answers them from range queries."""

    def query(self, promql: str, time: float | None = None) -> list[Sample]:
        """The vector of ``promql`` at ``time`` (Unix seconds; None: now). Raises PrometheusError."""
        ...


class TooManySamples(PrometheusError):
    """An answer held more than MAX_SAMPLES samples (a matrix: points): refused, unread past the bound."""


class Prometheus:
    """Instant and range queries against ``url`` (``http://HOST:9090``, or a Thanos/Mimir query front end with its
    path prefix, e.g. ``http://mimir/prometheus``; credentials as ``http://USER:PASSWORD@HOST``).

    ``timeout`` (seconds) bounds all the queries of this client together, from its creation, or ``deadline`` those of
    a whole command (gpuwarden.cluster.bounds.Deadline: ``drain`` asks Prometheus and the API server within one): a
    server that answers slowly, or drips its answer a byte at a time, ends in PrometheusError once it is spent. An
    answer is inflated in bounded steps, never past MAX_ANSWER_BYTES (gzip is asked for; a gzip bomb is refused at
    the bound). ``headers`` are sent with every request (e.g. ``X-Scope-OrgID`` for Mimir/Cortex tenants).
    """

    def __init__(
        self, url: str, timeout: float = 30.0, headers: dict[str, str] | None = None, tls: ClientTls | None = None,
        deadline: Deadline | None = None,
    ) -> None:  # fmt: skip
        base = url if "://" in url else f"http://{url}"
        self.base = base.rstrip("/")
        self.deadline = deadline or Deadline(timeout)
        self.timeout = self.deadline.seconds
        tls = tls or ClientTls()
        sent = {"Accept-Encoding": "gzip", **(headers or {})}
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
        target, answer = self._answered("/api/v1/query", params)
        if answer.kind == "scalar" and answer.result_is_list:
            try:
                value = _value(answer.scalar)
            except ValueError:
                raise PrometheusError(f"{target} answered a malformed vector") from None
            return [Sample({}, value)] if math.isfinite(value) else []
        if answer.kind != "vector" or not answer.result_is_list:
            raise PrometheusError(f"{target} answered a {visible(str(answer.kind)[:40])}, not a vector")
        if answer.malformed or answer.scalar or answer.points:
            raise PrometheusError(f"{target} answered a malformed vector")
        return answer.samples

    def query_range(self, promql: str, start: float, end: float, step: float) -> dict[int, list[Sample]]:
        """Evaluate ``promql`` at ``start``, ``start + step``, ... up to ``end`` (Unix seconds; ``/api/v1/query_range``)
        and return each evaluation's finite samples by its time in whole milliseconds (a time whose vector is empty
        is absent). An engine may move the times (VictoriaMetrics aligns a range of 50 steps or more to the step
        unless asked ``nocache=1``, which is sent; Thanos' and Mimir's query front ends align theirs): the caller
        checks the times it gets.

        Raises TooManySamples past MAX_SAMPLES points, and PrometheusError (one line) as ``query`` does for
        everything else, or when the answer is not a matrix.
        """
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}", "nocache": "1"}
        target, answer = self._answered("/api/v1/query_range", params)
        if answer.kind != "matrix" or not answer.result_is_list:
            raise PrometheusError(f"{target} answered a {visible(str(answer.kind)[:40])}, not a matrix")
        if answer.malformed or answer.scalar or answer.samples:
            raise PrometheusError(f"{target} answered a malformed matrix")
        out: dict[int, list[Sample]] = {}
        for ms, sample in answer.points:
            out.setdefault(ms, []).append(sample)
        return out

    def _answered(self, path: str, params: dict[str, str]) -> tuple[str, Answer]:
        """POST ``params`` to ``path``: (the target as printed, the Answer of a successful request). Raises
        PrometheusError (one line) for an answer that is not the API's, or the API's error."""
        target = f"{redacted(self.base)}{path}"  # as printed: never the password
        status, answer = self._post(target, path, params)
        if answer.invalid or answer.status is None:
            raise PrometheusError(f"{target} answered HTTP {status}, not the Prometheus API")
        if answer.status != "success":
            error = answer.error if answer.error is not None else f"HTTP {status}"
            raise PrometheusError(f"{target}: {visible(error[:300])}")
        return target, answer

    def _post(self, target: str, path: str, params: dict[str, str]) -> tuple[int, Answer]:
        """POST the query; return (HTTP status, the answer parsed as read) within the deadline, MAX_ANSWER_BYTES and
        MAX_SAMPLES (gpuwarden.cluster.bounds.Deadline: the exchange runs in a thread waited on until the deadline)."""
        try:
            return self.deadline.call(lambda left: self._exchange(target, path, params, left), target)
        except DeadlineExceeded as exc:
            raise PrometheusError(str(exc)) from None

    def _exchange(self, target: str, path: str, params: dict[str, str], left: float) -> tuple[int, Answer]:
        """The request itself: (HTTP status, the answer parsed chunk by chunk as it is read and inflated); raises
        PrometheusError (one line)."""
        try:
            with self._client.stream("POST", path, data=params, timeout=left) as resp:
                if resp.status_code in (401, 403):
                    raise PrometheusError(
                        f"{target} refused the request (HTTP {resp.status_code}): credentials in the URL?"
                    )
                parser = AnswerParser()
                body = decoded(resp.iter_raw(), resp.headers.get("content-encoding"), MAX_ANSWER_BYTES, target)
                for chunk in body:
                    if self.deadline.left() <= 0:
                        raise PrometheusError(self.deadline.message(target))
                    if not parser.feed(chunk):
                        what = "samples" if parser.answer.kind == "matrix" else "series"
                        raise TooManySamples(f"{target} answered more than {MAX_SAMPLES} {what}")
                return resp.status_code, parser.close()
        except AnswerTooLarge as exc:
            raise PrometheusError(str(exc)) from None
        except httpx.TimeoutException:
            raise PrometheusError(self.deadline.message(target)) from None
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach {target}: {visible(exc) or type(exc).__name__}") from None


def _value(pair: object) -> float:
    """A sample's ``[time, "value"]`` pair as its float value (Prometheus writes values as strings: "+Inf" too)."""
    if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
        raise ValueError("not a sample")
    return float(pair[1])


@dataclass
class Answer:
    """An answer of ``/api/v1/query`` or ``/api/v1/query_range`` as AnswerParser read it: its ``status``, ``error``
    and ``resultType`` (``kind``; None where absent or not text), whether ``data.result`` is a list, its finite vector
    samples, its finite matrix points (each with its time in whole milliseconds), and its bare values (a scalar's
    pair; in a vector, malformed). ``invalid``: not JSON, or not an object at the top; ``malformed``: an item that is
    not ``{"metric": {name: text}, "value": [time, "text"]}`` or ``{"metric": ..., "values": [[time, "text"],
    ...]}``."""

    status: str | None = None
    error: str | None = None
    kind: str | None = None
    result_is_list: bool = False
    samples: list[Sample] = field(default_factory=list)
    points: list[tuple[int, Sample]] = field(default_factory=list)
    scalar: list[Any] = field(default_factory=list)
    invalid: bool = False
    malformed: bool = False


#: Bytes handed to the JSON parser at once: its events for them are held until looked at (one per byte at most).
FEED_BYTES = 16384
#: An answer nested deeper than this is invalid (Prometheus's deepest is 5: data, result, item, metric or value,
#: and a label or a pair's member).
MAX_DEPTH = 32


class _Prefixes:
    """ijson's prefixed events (``ijson.parse``: each event with the dotted path of its container, ``item`` for an
    array's members) made from its basic events, refusing nesting past MAX_DEPTH. ijson builds the path of every
    event whatever the depth, so 100,000 nested arrays in one chunk made 100,000 paths of up to 500 KB each
    (tens of GB) before a single event could be looked at; this keeps the same rule on a bounded stack (tests hold
    its events to ijson.parse's). ``events`` is where the (prefix, event, value) triples go."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self._path: list[str | None] = []
        self.too_deep = False

    def add(self, event: str, value: Any) -> None:
        """Turn one basic event into its prefixed event; past MAX_DEPTH set ``too_deep`` and drop it."""
        path = self._path
        if event == "map_key":
            prefix = ".".join(str(p) for p in path[:-1])
            path[-1] = value
        elif event == "start_map" or event == "start_array":
            if len(path) >= MAX_DEPTH:
                self.too_deep = True
                return
            prefix = ".".join(str(p) for p in path)
            path.append(None if event == "start_map" else "item")
        elif event == "end_map" or event == "end_array":
            path.pop()
            prefix = ".".join(str(p) for p in path)
        else:
            prefix = ".".join(str(p) for p in path)
        self.events.append((prefix, event, value))


class AnswerParser:
    """Parses an answer of ``/api/v1/query`` or ``/api/v1/query_range`` from its chunks as they arrive (ijson's push
    parser: events for each chunk fed), keeping only the finite samples of a vector or points of a matrix (NaN and
    infinite values are not readings: dropped), with each label name and value kept once however many samples repeat
    it. Nesting past MAX_DEPTH makes the answer invalid. Never raises: ``feed`` returns False past MAX_SAMPLES
    samples or points, ``close`` the Answer (marked invalid or malformed as it was)."""

    _ITEM = "data.result.item"
    _METRIC = "data.result.item.metric"
    _PAIR = "data.result.item.value"
    _VALUES = "data.result.item.values"

    def __init__(self) -> None:
        self.answer = Answer()
        self._basic = ijson.sendable_list()
        self._coro = ijson.basic_parse_coro(self._basic, use_float=True)
        self._prefixes = _Prefixes()
        self._events = self._prefixes.events
        self._strings: dict[str, str] = {}
        self._in_result = False
        self._labels: dict[str, str] | None = None
        self._key: str | None = None
        self._pair: list[Any] | None = None
        self._pairs: list[list[Any]] | None = None  # a matrix item's pairs, kept until its labels are known
        self._top_checked = False

    def feed(self, chunk: bytes) -> bool:
        """Parse ``chunk``; False once the answer holds more than MAX_SAMPLES samples."""
        within = True
        for start in range(0, len(chunk), FEED_BYTES):  # a slice's events at a time: at most FEED_BYTES of them
            if self.answer.invalid:
                return True
            try:
                self._coro.send(chunk[start : start + FEED_BYTES])
            except ijson.JSONError:
                self.answer.invalid = True
            within = self._take()
            if not within:
                break
        return within

    def close(self) -> Answer:
        """The end of the answer: the Answer read."""
        if not self.answer.invalid:
            try:
                self._coro.close()
            except ijson.JSONError:
                self.answer.invalid = True
            self._take()
        return self.answer

    def _intern(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def _take(self) -> bool:
        answer = self.answer
        add = self._prefixes.add
        for event, value in self._basic:
            add(event, value)
            if self._prefixes.too_deep:
                answer.invalid = True
                break
        del self._basic[:]
        for prefix, event, value in self._events:
            if not self._top_checked:
                self._top_checked = True
                if event != "start_map":  # a list, a number, text: not the API's object
                    answer.invalid = True
            if prefix == "status" and event == "string":
                answer.status = value
            elif prefix == "error" and event == "string":
                answer.error = value
            elif prefix == "data.resultType" and event == "string":
                answer.kind = value
            elif prefix == "data.result":
                if event == "start_array":
                    self._in_result, answer.result_is_list = True, True
                elif event == "end_array":
                    self._in_result = False
            elif self._in_result and not answer.malformed:
                self._item(prefix, event, value)
        del self._events[:]
        return len(answer.samples) + len(answer.points) + len(self._pairs or ()) <= MAX_SAMPLES

    def _item(self, prefix: str, event: str, value: Any) -> None:
        """One event inside ``data.result``: a vector item's parts, or a bare value (a scalar's pair)."""
        if prefix == self._ITEM:
            self._item_event(event, value)
        elif prefix == self._METRIC or prefix.startswith(self._METRIC + "."):
            self._metric_event(prefix, event, value)
        elif prefix in (self._PAIR, self._PAIR + ".item"):
            self._pair_event(prefix, event, value)
        elif prefix.startswith(self._VALUES):
            self._values_event(prefix, event, value)
        # other keys of an item (Prometheus may add some) are passed over

    def _item_event(self, event: str, value: Any) -> None:
        """An item's own event: its start and end, or a scalar's value."""
        if event == "start_map":
            self._labels, self._pair, self._pairs = None, None, None
        elif event == "end_map":
            if self._pairs is None:
                self._sample()
            else:
                self._points()
        elif event in ("number", "string") and len(self.answer.scalar) < 2:
            self.answer.scalar.append(value)
        elif event != "map_key":
            self.answer.malformed = True

    def _metric_event(self, prefix: str, event: str, value: Any) -> None:
        """An event of an item's ``metric``: the map itself, a label's name, a label's value (strings only)."""
        if prefix != self._METRIC:
            if event == "string" and self._labels is not None and self._key is not None:
                self._labels[self._key] = self._intern(value)
            else:
                self.answer.malformed = True
        elif event == "start_map":
            self._labels = {}
        elif event == "map_key":
            self._key = self._intern(value)
        elif event != "end_map":
            self.answer.malformed = True

    def _pair_event(self, prefix: str, event: str, value: Any) -> None:
        """An event of an item's ``value``: the array, or one of its two parts (time and value)."""
        if prefix == self._PAIR:
            if event == "start_array":
                self._pair = []
            elif event != "end_array":
                self.answer.malformed = True
        elif self._pair is not None and event in ("number", "string") and len(self._pair) < 2:
            self._pair.append(value)
        else:
            self.answer.malformed = True

    def _values_event(self, prefix: str, event: str, value: Any) -> None:
        """An event of a matrix item's ``values``: the array, a pair's start and end, or one of a pair's two parts."""
        if prefix == self._VALUES:
            if event == "start_array" and self._pairs is None and self._pair is None:
                self._pairs = []
            elif event != "end_array":
                self.answer.malformed = True
        elif prefix == self._VALUES + ".item" and self._pairs is not None:
            if event == "start_array":
                self._pairs.append([])
            elif event != "end_array":
                self.answer.malformed = True
        elif prefix == self._VALUES + ".item.item" and self._pairs and event in ("number", "string"):
            if len(self._pairs[-1]) < 2:
                self._pairs[-1].append(value)
            else:
                self.answer.malformed = True
        else:
            self.answer.malformed = True

    def _points(self) -> None:
        """The end of a matrix item: keep its whole, finite points with their times in whole milliseconds."""
        labels = self._labels if self._labels is not None else {}
        if self._pair is not None:  # both "value" and "values"
            self.answer.malformed = True
            return
        for pair in self._pairs or ():
            try:
                value, at = _value(pair), float(pair[0])
            except (ValueError, TypeError):
                self.answer.malformed = True
                return
            if math.isfinite(value) and math.isfinite(at):
                self.answer.points.append((round(at * 1000), Sample(labels, value)))
        self._pairs = None

    def _sample(self) -> None:
        """The end of a vector item: keep its sample if whole and finite."""
        try:
            value = _value(self._pair)
        except (ValueError, TypeError):
            self.answer.malformed = True
            return
        if self._labels is None:
            self._labels = {}
        if math.isfinite(value):
            self.answer.samples.append(Sample(self._labels, value))
