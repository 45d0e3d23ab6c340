"""One log for the daemon and uvicorn, in the formats the Prometheus exporters use: logfmt (the default) or JSON.

``setup(level, fmt)`` gives the root logger one handler on standard error with the chosen formatter and makes
uvicorn's loggers write through it (uvicorn runs with ``log_config=None``). A record's structured fields - the
``extra={...}`` of a logging call, for example ``gpu``, ``call``, ``error`` - become keys of the line, as
``--log.format`` of node_exporter writes them: ``ts=... level=info logger=gpuwarden.daemon msg="..." gpu=0``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

#: Attributes every LogRecord has: anything else on a record is a structured field of the call.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}

LEVELS = ("debug", "info", "warning", "error")
#: Access lines (``uvicorn.access``, written at ``debug`` only) let through per second, and in one burst: a request
#: flood must not become a log flood (each dropped line is counted in the next line let through, ``dropped=N``).
ACCESS_LINES_PER_SECOND = 10.0
ACCESS_LINES_BURST = 100
FORMATS = ("logfmt", "json")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    if record.exc_info:
        out["error"] = logging.Formatter().formatException(record.exc_info).splitlines()[-1]
    return out


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\') and all(c.isprintable() for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    """A record as one logfmt line: ``key=value`` pairs, values quoted (JSON string rules) where they need it."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record's line (a traceback shrinks to its last line, in ``error``)."""
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    """A record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record's JSON line."""
        return json.dumps(_fields(record), ensure_ascii=False, default=str)


def setup(level: str = "info", fmt: str = "logfmt") -> None:
    """Send every log record (gpuwarden's, uvicorn's, asyncio's) to standard error as ``fmt`` lines at ``level``.

    Raises ValueError for a level or format that is not one of LEVELS / FORMATS. Idempotent: a second call replaces
    the handler (configuration reload).
    """
    if level not in LEVELS or fmt not in FORMATS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)} and format one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # Access lines only at debug (uvicorn decides per connection from whether its access logger has a handler to
    # reach), and at most ACCESS_LINES_PER_SECOND of them whatever the level.
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = level == "debug"
    if not any(isinstance(f, RateLimit) for f in access.filters):
        access.addFilter(RateLimit(ACCESS_LINES_PER_SECOND, ACCESS_LINES_BURST))


class RateLimit(logging.Filter):
    """A token bucket over log records: lets ``rate`` records a second through, ``burst`` at once; the first record
    let through after some were dropped carries ``dropped`` (how many) as a field of its line."""

    def __init__(self, rate: float, burst: int) -> None:
        super().__init__()
        self.rate, self.burst = rate, float(burst)
        self._tokens, self._last, self._dropped = float(burst), time.monotonic(), 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False (drop the record) when the bucket is empty."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens < 1.0:
                self._dropped += 1
                return False
            self._tokens -= 1.0
            if self._dropped:
                record.dropped = self._dropped
                self._dropped = 0
            return True
