"""Recorded traces: JSON Lines of raw readings (format in docs/trace-format.md).

Line 1 is a header (node static facts, poll interval, free-form metadata such as the scenario);
then, for every poll, one ``host`` record and one ``gpu`` record per GPU, all carrying the poll's
sequence number. Files ending in ``.gz`` are gzip-compressed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import shutil
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuwarden.model import GpuReading, HostReading, NodeStatic, PollResult

log = logging.getLogger(__name__)

FORMAT: Final = "gpuwarden-trace"
#: Version 2 adds the job-CPU and I/O facts of each process (ProcessReading.tree_*, cgroup_cpu_seconds_total);
#: version 1 traces, which lack them, still read and replay.
VERSION = 2


class TraceError(Exception):
    """A trace cannot be read or is malformed; ``str()`` names the file and line in one line."""


class TraceHeader(BaseModel):
    """The first line of a trace."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["header"] = "header"
    format: Literal["gpuwarden-trace"] = FORMAT
    version: int = Field(default=VERSION, ge=1, le=VERSION)
    created: float = Field(description="Unix seconds when recording started")
    poll_interval_seconds: float = Field(gt=0)
    node: NodeStatic
    metadata: dict[str, Any] = Field(default_factory=dict)


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


class TraceWriter:
    """Writes a trace: ``write(poll)`` appends one poll; use as a context manager or call ``close()``.

    Each poll is flushed to the file as it is written (a gzip stream with a sync flush, so everything before it
    decompresses), so a recording killed, or stopped by a full disk, keeps every complete poll readable
    (``read_trace`` drops the incomplete end and says so). ``overwrite=False`` refuses an existing file
    (FileExistsError). Raises OSError where the file cannot be created or written; a header that cannot be written
    leaves no file behind.
    """

    def __init__(self, path: Path, header: TraceHeader, overwrite: bool = True) -> None:
        self._file = _open(path, "w" if overwrite else "x")
        self._seq = 0
        self._broken = False
        try:
            self._file.write(header.model_dump_json(exclude_none=True) + "\n")
            self._flush()
        except OSError:  # a full disk before the header: no trace at all rather than an empty file that reads as one
            self._broken = True
            self.close()
            path.unlink(missing_ok=True)
            raise

    @property
    def polls(self) -> int:
        """Polls written so far."""
        return self._seq

    def _flush(self) -> None:
        self._file.flush()
        raw = getattr(self._file, "buffer", None)
        if isinstance(raw, gzip.GzipFile):
            raw.flush(zlib.Z_SYNC_FLUSH)

    def write(self, poll: PollResult) -> None:
        """Append the host record and one record per GPU of ``poll``."""
        self._seq += 1
        host: dict[str, Any] = {"type": "host", "poll": self._seq, "duration_seconds": poll.duration_seconds}
        if poll.host is not None:
            host.update(poll.host.model_dump(exclude_none=True))
        else:
            host["timestamp"] = poll.timestamp
        lines = [json.dumps(host)]
        for g in poll.gpus:
            rec = {"type": "gpu", "poll": self._seq}
            rec.update(g.model_dump(mode="json", exclude_none=True))
            if not rec.get("unsupported"):
                rec.pop("unsupported", None)  # every reading answered: nothing to say (and older traces unchanged)
            lines.append(json.dumps(rec))
        try:
            self._file.write("\n".join(lines) + "\n")
            self._flush()
        except OSError:
            self._broken = True
            raise

    def close(self) -> None:
        """Flush and close the file (after a failed write, close what can be closed: the polls before it are on
        disk already)."""
        try:
            self._file.close()
        except OSError:
            if not self._broken:
                raise

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rewrite_header(path: Path, header: TraceHeader) -> None:
    """Replace the header of the trace at ``path`` with ``header`` (what ``record`` learns at the end: the live
    verdicts). The trace is written anew beside it and renamed over it, so a failure leaves it as it was. Raises
    OSError where the file cannot be read or written."""
    tmp = path.with_name(f".{path.name}.part{path.suffix}")  # same suffix: compressed alike
    try:
        with _open(path, "r") as src, _open(tmp, "w") as dst:
            src.readline()
            dst.write(header.model_dump_json(exclude_none=True) + "\n")
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_trace(path: Path) -> tuple[TraceHeader, list[PollResult]]:
    """Read and validate a whole trace.

    Returns the header and the polls in order. Raises TraceError (file, line, what is wrong) for a
    missing file, invalid JSON, a record that does not match the models, or a trace with no poll. A trace whose
    end was cut off (a recording killed, a full disk: a compressed stream without its end, a last line without its
    newline, a last poll without all its GPUs) is read up to its last complete poll, and the loss logged
    (``read_trace_losses`` returns it).
    """
    reader, header, polls = _whole(path)
    reader.warn_dropped()
    return header, polls


def read_trace_losses(path: Path) -> tuple[TraceHeader, list[PollResult], str | None]:
    """Return what ``read_trace`` returns, and a sentence on what was dropped from a cut-off end (None: nothing).

    Raises TraceError as ``read_trace`` does.
    """
    reader, header, polls = _whole(path)
    return header, polls, reader.dropped


def _whole(path: Path) -> tuple[TracePass, TraceHeader, list[PollResult]]:
    """One whole pass over the trace at ``path``: the pass (its ``dropped``), the header and every poll."""
    reader = TracePass(path)
    polls = list(reader)
    assert reader.header is not None  # a pass that ended without TraceError read the header
    return reader, reader.header, polls


class TracePass:
    """One pass over the trace at ``path``: iterating it reads and validates the file a record at a time and yields
    each poll as it completes (a replay holds one poll, not the trace). ``header`` is set once the first record is
    read, ``dropped`` once the pass ends (a sentence on a cut-off end, as ``read_trace_losses`` returns it; None:
    nothing lost). Iterating raises TraceError as ``read_trace`` does, where the problem is met; the file is closed
    when the pass ends or the iterator is closed. Each iteration is a new pass."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: TraceHeader | None = None
        self.dropped: str | None = None

    def warn_dropped(self) -> None:
        """Log what the pass dropped from a cut-off end (a warning naming the file), if anything."""
        if self.dropped is not None:
            log.warning("%s: %s", self.path, self.dropped)

    def __iter__(self) -> Iterator[PollResult]:
        path = self.path
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO blocks, a device such as /dev/zero never ends
                raise TraceError(f"{path}: not a regular file")
            with _open(path, "r") as f:
                yield from _polls(self, f)
        except OSError as exc:
            raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
        except EOFError as exc:
            raise TraceError(f"{path}: truncated compressed trace") from exc
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise TraceError(f"{path}: damaged compressed trace ({exc})") from exc
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


class _Cut:
    """What the end of a cut-off trace lost: set while reading it."""

    def __init__(self) -> None:
        self.stream = False  # the compressed stream ended early
        self.line: int | None = None  # the number of a last line without its newline, dropped


#: A trace line longer than this is refused (a poll of 8 GPUs with processes is a few KiB per line).
MAX_LINE_CHARS = 1 << 22


def _raw_lines(f: IO[str], cut: _Cut) -> Iterator[str]:
    while True:
        try:
            line = f.readline(MAX_LINE_CHARS + 1)
        except EOFError:  # a gzip stream without its end: what came before was decompressed
            cut.stream = True
            return
        if not line:
            return
        yield line


def _lines(f: IO[str], cut: _Cut) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, line in enumerate(_raw_lines(f, cut), 1):
        if len(line) > MAX_LINE_CHARS:
            raise TraceError(f"line {n}: longer than {MAX_LINE_CHARS} characters")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except RecursionError as exc:
            raise TraceError(f"line {n}: JSON nested too deeply") from exc
        except json.JSONDecodeError as exc:
            if not line.endswith("\n"):  # the file ends inside this line: a cut-off end, not damage
                cut.line = n
                return
            raise TraceError(f"line {n}: invalid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise TraceError(f"line {n}: a record must be a JSON object")
        yield n, obj


def _polls(reader: TracePass, f: IO[str]) -> Iterator[PollResult]:
    """The polls of the open trace ``f`` in order, each yielded as its last record is read; sets ``reader.header``
    at the first record and ``reader.dropped`` at the end. Raises TraceError naming the file and line."""
    path = reader.path
    header: TraceHeader | None = None
    count = 0
    current: dict[str, Any] | None = None
    cut = _Cut()
    try:
        for n, obj in _lines(f, cut):
            kind = obj.pop("type", None)
            if header is None:
                header = reader.header = _header(n, kind, obj)
                continue
            begun = _record(n, kind, obj, current)
            if begun is not None:
                if current is not None:
                    count += 1
                    yield _finish(current)
                current = begun
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from exc
    losses = _losses(cut)
    last = None
    if current is not None:
        if header is not None and len(current["gpus"]) >= len(header.node.gpus):
            try:
                last = _finish(current)
            except TraceError as exc:
                raise TraceError(f"{path}: {exc}") from exc
            count += 1
        else:
            losses.append(f"poll {current['seq']} (from line {current['line']}) is incomplete")
    why = f" ({'; '.join(losses)})" if losses else ""
    if header is None:
        raise TraceError(f"{path}: empty trace (no header){why}")
    if not count:
        raise TraceError(f"{path}: trace has a header but no poll{why}")
    reader.dropped = f"cut-off end dropped ({'; '.join(losses)}); {count} complete polls read" if losses else None
    if last is not None:
        yield last


@contextlib.contextmanager
def _at_line(n: int) -> Iterator[None]:
    """A pydantic ValidationError inside becomes a TraceError naming line ``n``, the field and pydantic's reason."""
    try:
        yield
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise TraceError(f"line {n}: {where}: {err['msg']}") from exc


def _header(n: int, kind: object, obj: dict[str, Any]) -> TraceHeader:
    """The trace's header from its first record (line ``n``). Raises TraceError for any other record or a header
    that does not validate."""
    if kind != "header":
        raise TraceError(f"line {n}: the first record must be the header")
    with _at_line(n):
        return TraceHeader.model_validate({"type": "header", **obj})


def _record(n: int, kind: object, obj: dict[str, Any], current: dict[str, Any] | None) -> dict[str, Any] | None:
    """Read record ``obj`` (line ``n``): a host record begins a poll and returns its state (line, sequence number,
    time, duration, host reading, GPUs so far); a GPU record joins ``current`` and returns None. Raises TraceError
    for a record without its poll number, a GPU record out of its poll, an unknown type or a field that does not
    validate."""
    seq = obj.pop("poll", None)
    if not isinstance(seq, int):
        raise TraceError(f"line {n}: record without an integer 'poll'")
    with _at_line(n):
        if kind == "host":
            duration = obj.pop("duration_seconds", 0.0)
            host = HostReading.model_validate(obj) if "cpu_count" in obj else None
            return {"line": n, "seq": seq, "timestamp": obj.get("timestamp"), "duration": duration, "host": host,
                    "gpus": []}  # fmt: skip
        if kind == "gpu":
            if current is None or current["seq"] != seq:
                raise TraceError(f"line {n}: gpu record of poll {seq} without its host record")
            current["gpus"].append(GpuReading.model_validate(obj))
            return None
    raise TraceError(f"line {n}: unknown record type {kind!r}")


def _losses(cut: _Cut) -> list[str]:
    """What a cut-off end lost, in words (an early end of the compressed stream, a cut line)."""
    losses: list[str] = []
    if cut.stream:
        losses.append("the compressed stream ends early")
    if cut.line is not None:
        losses.append(f"line {cut.line} is cut off")
    return losses


def _finish(cur: dict[str, Any]) -> PollResult:
    ts = cur["timestamp"]
    if ts is None:
        ts = cur["gpus"][0].timestamp if cur["gpus"] else 0.0
    try:
        return PollResult(timestamp=ts, duration_seconds=cur["duration"], gpus=cur["gpus"], host=cur["host"])
    except ValidationError as exc:  # the host record's timestamp or duration_seconds
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise TraceError(f"line {cur['line']}: {where}: {err['msg']}") from exc
