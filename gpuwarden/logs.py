"""One log for the daemon and its HTTP server, in the formats the Prometheus exporters use: logfmt (the default) or
JSON.

``setup(level, fmt)`` gives the root logger one handler on standard error with the chosen formatter. A record's
structured fields - the ``extra={...}`` of a logging call, for example ``gpu``, ``call``, ``error`` - become keys
of the line, as ``--log.format`` of node_exporter writes them:
``ts=... level=info logger=gpuwarden.daemon msg="..." gpu=0``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: Attributes every LogRecord has: anything else on a record is a structured field of the call.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}

LEVELS = ("debug", "info", "warning", "error")
#: Access lines (``gpuwarden.access``, written at ``debug`` only) let through per ACCESS_LINES_PERIOD seconds: a
#: request flood must not become a log flood (the first line of the next period says how many were dropped).
ACCESS_LINES_BURST = 100
ACCESS_LINES_PERIOD = 10.0
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
    """Send every log record (gpuwarden's, its libraries', asyncio's) to standard error as ``fmt`` lines at ``level``.

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
    # httpx and httpcore log every request's full URL at INFO and DEBUG: a Prometheus URL's user:password and a chat
    # webhook's URL, which is its secret. Their warnings only, at any level; gpuwarden logs its requests' outcomes.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Access lines (logged at debug) at most ACCESS_LINES_BURST per ACCESS_LINES_PERIOD.
    access = logging.getLogger("gpuwarden.access")
    if not any(isinstance(f, RateLimitFilter) for f in access.filters):
        access.addFilter(RateLimitFilter(ACCESS_LINES_BURST, ACCESS_LINES_PERIOD))


class RateLimitFilter(logging.Filter):
    """Lets at most ``burst`` records at ``level`` or above through per ``period`` seconds and logger (those below
    pass), then one line saying how many were dropped (asyncio logs its accept-loop error at the descriptor limit on
    every retry; a request flood would log an access line per request)."""

    def __init__(self, burst: int = 5, period: float = 60.0, level: int = logging.NOTSET) -> None:
        super().__init__()
        self.burst, self.period, self.level = burst, period, level
        self._window: dict[str, tuple[float, int, int]] = {}  # logger -> (window start, passed, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        """Return True for a record within the rate, or below ``level`` (never limited); a record that opens a
        window also reports the dropped ones."""
        if record.levelno < self.level:
            return True
        now = time.monotonic()
        start, passed, dropped = self._window.get(record.name, (now, 0, 0))
        if now - start >= self.period:
            if dropped:
                record.msg = f"{record.getMessage()} ({dropped} similar messages dropped in the last {self.period:g} s)"
                record.args = ()
            start, passed, dropped = now, 0, 0
        if passed >= self.burst:
            self._window[record.name] = (start, passed, dropped + 1)
            return False
        self._window[record.name] = (start, passed + 1, dropped)
        return True
