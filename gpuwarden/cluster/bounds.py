"""What an answer from Prometheus or the Kubernetes API server may cost a command: time, for the whole command, and
bytes, once inflated.

- **Deadline**: one time by which every request of a command is answered (``--timeout``). httpx's timeouts bound each
  read, not a request: a server that drips its status line, headers or body a byte at a time outlasts them for ever.
  Each request runs in a thread the command waits on until the deadline, and is left behind (a daemon thread) when
  it is spent.
- **decoded**: an answer's body inflated as its ``Content-Encoding`` says (gzip or deflate; identity), at most
  DECODE_BYTES at a time and never past a bound. httpx's decoders inflate each chunk read whole, so a 200 KB gzip
  bomb took a command past 180 MB before any check could run; zlib's ``max_length`` keeps each step's output
  bounded. Only what httpx's decoders do (the same output: tests/test_bounds.py holds it to httpx's), with the
  bound.
- **listed**: a list answer's members one at a time (a Kubernetes node list of 10 MB took 122 MB parsed whole).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from time import monotonic
from typing import Any, TypeVar

import ijson  # type: ignore[import-untyped]

T = TypeVar("T")

#: Bytes inflated at a time: a compressed chunk is inflated in steps of this many, each counted against the bound.
DECODE_BYTES = 64 * 1024


class DeadlineExceeded(Exception):
    """The command's deadline passed before an answer came. The message is one line for the user."""


class AnswerTooLarge(Exception):
    """An answer inflated past the bound it is read within, or came in an encoding that cannot be bounded."""


class Deadline:
    """The time by which all of a command's requests must be answered: ``seconds`` from its creation (the option
    ``--timeout``, named so in the messages)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = monotonic() + seconds

    def left(self) -> float:
        """Seconds left (0 or less: spent)."""
        return self._at - monotonic()

    def message(self, what: str) -> str:
        """The one line a request past the deadline ends with."""
        return f"{what}: no answer within --timeout {self.seconds:g} s"

    def call(self, request: Callable[[float], T], what: str) -> T:
        """``request(left)`` (``left``: the seconds it may take, for its own per-read timeouts) in a thread waited on
        until the deadline; its result, or the exception it raised before the deadline. Raises DeadlineExceeded
        (``what`` names the request) when the deadline passes first, is spent already, or passed as the request
        failed (its own timeout of ``left`` seconds may fire before the wait for it ends)."""
        left = self.left()
        if left <= 0:
            raise DeadlineExceeded(self.message(what))
        answer: list[T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                answer.append(request(left))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                error.append(exc)

        worker = threading.Thread(target=run, name="gpuwarden-request", daemon=True)
        worker.start()
        worker.join(left)
        if error and self.left() > 0:
            raise error[0]
        if error:  # its own per-read timeout (``left``) fired as the deadline passed: on a loaded machine, first
            raise DeadlineExceeded(self.message(what)) from None
        if not answer:  # still reading: left behind, the command ends with the error
            raise DeadlineExceeded(self.message(what))
        return answer[0]


def decoded(raw: Iterable[bytes], encoding: str | None, limit: int, what: str) -> Iterator[bytes]:
    """The body of an answer from its ``raw`` chunks (httpx's ``iter_raw``), inflated as ``encoding`` (its
    ``Content-Encoding``: none or ``identity``, ``gzip``, ``deflate`` with a zlib header or raw: httpx's decoders'
    encodings but brotli's and zstd's), DECODE_BYTES at most at a time. Raises AnswerTooLarge past ``limit`` bytes
    inflated (``what`` names the answer), for another encoding or several (gpuwarden asks for gzip only), or for a
    body that is not the encoding it says it is."""
    coding = _coding(encoding, what)
    total = 0
    for piece in raw if coding is None else _inflated(raw, coding, what):
        total += len(piece)
        if total > limit:
            raise AnswerTooLarge(f"{what} answered more than {limit} bytes")
        yield piece


def _coding(encoding: str | None, what: str) -> str | None:
    """The one coding of a ``Content-Encoding`` value gpuwarden reads (``gzip`` or ``deflate``; None for none or
    ``identity``); AnswerTooLarge for another or several."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip().lower() not in ("", "identity")]
    if len(codings) > 1 or (codings and codings[0] not in ("gzip", "deflate")):
        raise AnswerTooLarge(f"{what} came in an encoding gpuwarden does not read: {(encoding or '')[:40]!r}")
    return codings[0] if codings else None


def _inflated(raw: Iterable[bytes], coding: str, what: str) -> Iterator[bytes]:
    """``raw`` inflated as ``coding`` (gzip or deflate), DECODE_BYTES at most at a time; AnswerTooLarge for a body
    that is not that encoding."""
    wrong = f"{what}: a body that is not the {coding} it says it is"
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # a gzip or a zlib header, told apart by zlib
    # deflate without its zlib header, as some servers send it (httpx tries it too): the bytes read before the first
    # output are kept to start again with a raw inflater, once
    before: bytes | None = b"" if coding == "deflate" else None
    for chunk in raw:
        data = chunk
        while data and not inflater.eof:
            try:
                piece = inflater.decompress(data, DECODE_BYTES)
            except zlib.error:
                if before is None:
                    raise AnswerTooLarge(wrong) from None
                inflater, data, before = zlib.decompressobj(-zlib.MAX_WBITS), before + data, None
                continue
            if before is not None:  # kept until the first output, and never more than a step's worth
                before = before + data[: len(data) - len(inflater.unconsumed_tail)]
                before = None if piece or len(before) > DECODE_BYTES else before
            data = inflater.unconsumed_tail
            if piece:
                yield piece
    try:
        rest = inflater.flush()
    except zlib.error:
        raise AnswerTooLarge(wrong) from None
    if rest:
        yield rest


#: The deepest nesting an answer read by ``listed`` may have (a Kubernetes node is about 8 deep).
MAX_DEPTH = 32
#: Bytes handed to the JSON parser at once (its events for them are held until looked at).
FEED_BYTES = 16384


def listed(chunks: Iterable[bytes], key: str, item_bytes: int, what: str) -> Iterator[Any]:
    """The members of the array under the top-level ``key`` of the JSON object in ``chunks`` (a Kubernetes list's
    ``items``), each built (ijson's ObjectBuilder over its push parser) and handed on before the next is read: a list
    costs one member at a time, not its whole tree. Raises AnswerTooLarge for nesting past MAX_DEPTH or a member with
    more than ``item_bytes`` of names and text (``what`` names the answer), ValueError for what is not JSON."""
    events = ijson.sendable_list()
    parser = ijson.basic_parse_coro(events, use_float=True)
    depth, top_key, in_list = 0, None, False
    builder: ijson.ObjectBuilder | None = None
    size = 0

    def step(event: str, value: Any) -> Any:
        """One event; the member it completes, else None."""
        nonlocal depth, top_key, in_list, builder, size
        if event in ("start_map", "start_array"):
            depth += 1
            if depth > MAX_DEPTH:
                raise AnswerTooLarge(f"{what}: nested deeper than {MAX_DEPTH}")
            if depth == 2 and event == "start_array" and top_key == key:
                in_list = True
                return None
        elif event in ("end_map", "end_array"):
            depth -= 1
            if depth == 1 and in_list:
                in_list = False
                return None
        elif event == "map_key" and depth == 1:
            top_key = value
        if not in_list:
            return None
        if builder is None:
            builder, size = ijson.ObjectBuilder(), 0
        if isinstance(value, str):
            size += len(value)
            if size > item_bytes:
                raise AnswerTooLarge(f"{what}: a member of {key!r} of more than {item_bytes} bytes")
        builder.event(event, value)
        if depth == 2:  # the member's own end (or a member that is a plain value)
            done, builder = builder.value, None
            return done
        return None

    try:
        for chunk in chunks:
            for start in range(0, len(chunk), FEED_BYTES):
                parser.send(chunk[start : start + FEED_BYTES])
                for event, value in events:
                    member = step(event, value)
                    if member is not None:
                        yield member
                del events[:]
        parser.close()
    except ijson.JSONError as exc:
        raise ValueError(f"{what}: not JSON ({str(exc)[:80]})") from None
    for event, value in events:
        member = step(event, value)
        if member is not None:
            yield member
