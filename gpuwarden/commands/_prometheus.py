"""The flags ``top`` and ``report`` share: where Prometheus is, the range, step and selector of the accounting."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from gpuwarden.cluster.durations import seconds
from gpuwarden.terminal import visible


def add_common(p: argparse.ArgumentParser) -> None:
    """Add the Prometheus flags of ``top`` and ``report`` to ``p``."""
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="the Prometheus HTTP API (Prometheus, Thanos Query, Mimir, VictoriaMetrics), e.g. "
                   "http://prometheus:9090")  # fmt: skip
    p.add_argument("--range", default="1d", type=duration, help="how far back, as PromQL writes it (default 1d)")
    p.add_argument("--step", default="1m", type=duration,
                   help="resolution of the accounting (default 1m); the GPU-hours are the same at any step, the range "
                   "a whole number of them")  # fmt: skip
    p.add_argument("--resolution", default=None, type=duration,
                   help="how finely counters are summed and a GPU's time split between the jobs that held it "
                   "(default 15s, coarser past a day of range: range/5760): at most the scrape interval keeps every "
                   "job's hours exact; longer is cheaper")  # fmt: skip
    p.add_argument("--at", type=instant, metavar="TIME",
                   help="end of the range: Unix seconds or RFC 3339 (2026-11-24T18:00:00Z); default now")  # fmt: skip
    p.add_argument("--cluster.labels", dest="cluster_labels", type=label_names, default=("cluster",),
                   metavar="LABELS", help="labels that name a cluster, comma-separated (default cluster): a job id "
                   "or a node is one within its cluster, as the alert rules' cluster_labels")  # fmt: skip
    p.add_argument("--selector", default="", metavar="MATCHERS",
                   help='label matchers for every series, e.g. \'cluster="train-a"\'')  # fmt: skip
    p.add_argument("--timeout", type=positive_seconds, default=60.0,
                   help="seconds to wait for Prometheus, all queries together (default 60)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--header", action="append", default=[], type=header, metavar="'NAME: VALUE'",
                   help="an HTTP header for every query, e.g. 'X-Scope-OrgID: team-a' (Mimir, Cortex tenants); "
                   "repeatable")  # fmt: skip
    p.add_argument("--prometheus.bearer-token-file", dest="bearer_token_file", metavar="FILE",
                   help="send the token in FILE as Authorization: Bearer")  # fmt: skip
    p.add_argument("--prometheus.ca-file", dest="ca_file", metavar="FILE",
                   help="CA certificates (PEM) to verify an https Prometheus with (default: the system's)")  # fmt: skip
    p.add_argument("--prometheus.cert-file", dest="cert_file", metavar="FILE",
                   help="client certificate (PEM) for mutual TLS, with --prometheus.key-file")  # fmt: skip
    p.add_argument("--prometheus.key-file", dest="key_file", metavar="FILE", help="its private key (PEM)")


def header(text: str) -> tuple[str, str]:
    """Return ``NAME: VALUE`` as (name, value); raises argparse.ArgumentTypeError for anything HTTP cannot send (a
    name outside RFC 9110's token characters, a value with control characters)."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name) or not value.isprintable():
        raise argparse.ArgumentTypeError(f"expects 'NAME: VALUE' (an HTTP header), got {visible(text)!r}")
    return name, value


def instant(text: str) -> float:
    """Return ``text`` (Unix seconds, or an RFC 3339 time with its zone) as Unix seconds; raises
    argparse.ArgumentTypeError for anything else."""
    from datetime import datetime

    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not Unix seconds or an RFC 3339 time: {visible(text)!r}") from None
        if when.tzinfo is None:
            zone = "an RFC 3339 time needs its zone (Z, +02:00)"
            raise argparse.ArgumentTypeError(f"{zone}: {visible(text)!r}") from None
        return when.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"not Unix seconds or an RFC 3339 time: {visible(text)!r}")
    return value


def label_names(text: str) -> tuple[str, ...]:
    """Return ``text``, label names separated by commas, as a tuple; raises argparse.ArgumentTypeError for a name
    Prometheus would refuse."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", x) for x in names):
        raise argparse.ArgumentTypeError(f"expects label names separated by commas, got {visible(text)!r}")
    return names


def duration(text: str) -> str:
    """Return ``text`` if it is a PromQL duration (``1d``, ``90m``); raises argparse.ArgumentTypeError if not."""
    try:
        seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def bounded(kind: Callable[[str], float], says: str, high: float = math.inf) -> Callable[[str], float]:
    """An argparse ``type``: the text read as ``kind`` (int or float), finite, above 0 and at most ``high``; anything
    else raises argparse.ArgumentTypeError "must be SAYS: 'TEXT'" (argparse prints it with the flag, exit 2)."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= high):
            raise argparse.ArgumentTypeError(f"must be {says}: {text!r}")
        return value

    return convert


#: ``--timeout``: seconds above 0.
positive_seconds = bounded(float, "a number of seconds above 0")
