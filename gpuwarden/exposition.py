"""Rendering a snapshot as the Prometheus exposition, once per snapshot and format.

``families()`` runs every enabled collector over a snapshot and adds ``gpuwarden_scrape_collector_success`` /
``_duration_seconds`` per collector (as node_exporter does): a failing collector is visible and does not take the
others down. ``Exposition.render()`` caches the rendered bytes by snapshot sequence number and format, so any
number of scrapes between two polls cost one render. The format is negotiated from the scrape's ``Accept`` header
by prometheus_client (``choose_encoder``: the text format 0.0.4, or OpenMetrics 1.0 as Prometheus asks for it),
and the body gzipped when ``Accept-Encoding`` allows (``gzip_accepted``, with q-values), once per rendered text.

The daemon renders ahead in the poll thread (``prerender``), in the format the last scrape asked for, so a scrape
finds the text ready and only sends bytes; it renders ahead only on the last poll before the next scrape is due
(scrapes are periodic: the next is expected one scrape gap after the last), so a 1 s poll scraped every 15 s pays
one render per scrape, not fifteen. When polls come faster than once per ``min_age`` (1 s), the rendered text is
reused for up to ``min_age``: rendering at most once a second bounds the CPU a fast poll costs.

The text is written by gpuwarden.families.TextWriter, one per format, byte for byte what prometheus_client's encoders
write (tests/test_exposition_cache.py and tests/test_golden_expositions.py hold it; prometheus_client's parser,
``promtool check metrics`` and an OpenMetrics parser read it back in tests/test_exposition_format.py): each series'
name-and-labels text is made once and kept, each value formatted per render. The format is still negotiated by
prometheus_client (``choose_encoder``), which names the content types.
"""

from __future__ import annotations

import functools
import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.exposition import choose_encoder

from gpuwarden.catalog import FAMILY
from gpuwarden.collectors import CollectOptions, collect
from gpuwarden.collectors.registry import new_values
from gpuwarden.families import MetricFamily, TextWriter
from gpuwarden.snapshot import NodeSnapshot, SnapshotHolder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Format:
    """A negotiated exposition format: its ``content_type`` (prometheus_client's name for it)."""

    content_type: str

    @property
    def openmetrics(self) -> bool:
        """True for the OpenMetrics text format."""
        return self.content_type.startswith("application/openmetrics-text")


@functools.lru_cache(maxsize=64)
def negotiate(accept: str | None) -> Format:
    """Return the format for an ``Accept`` header (prometheus_client's ``choose_encoder``; the 0.0.4 text format
    when the header is absent or names nothing it knows)."""
    return Format(choose_encoder(accept or "")[1])


#: The format of a request that asks for none.
PLAIN = negotiate(None)


def families(snap: NodeSnapshot, collectors: list[str], options: CollectOptions) -> Iterator[MetricFamily]:
    """Yield every enabled collector's families for ``snap``, then per-collector success and duration."""
    success = new_values(FAMILY["gpuwarden_scrape_collector_success"])
    duration = new_values(FAMILY["gpuwarden_scrape_collector_duration_seconds"])
    for name in collectors:
        start = time.perf_counter()
        try:
            made = list(collect(name, snap, options))
            ok = 1.0
        except Exception:  # noqa: BLE001 - one collector's failure must not break the scrape
            log.exception("collector %s failed", name)
            made, ok = [], 0.0
        yield from made
        success.add_metric([name], ok)
        duration.add_metric([name], time.perf_counter() - start)
    yield success
    yield duration


#: After a scrape, render ahead at every poll for at most this long while the next one is not known to be due
#: later (the period is not known yet, or the scrape is overdue); Prometheus's scrape intervals are seconds to a
#: minute.
FIRST_GAP_MAX = 120.0


@dataclass(slots=True)
class _Scrapes:
    """What the scrapes in one format told: when the last came, the gap before it, whether it took gzip."""

    fmt: Format
    last: float
    gap: float | None = None
    gzip: bool = False


def _rendering_ahead(seen: _Scrapes, now: float) -> bool:
    """Whether the poll thread renders ``seen``'s format ahead: its scrapes showed a period, or came lately."""
    return seen.gap is not None or now - seen.last <= FIRST_GAP_MAX


class Exposition:
    """Renders the latest snapshot of ``holder`` (the poller) to an exposition format, cached per snapshot.

    ``render(snap, fmt)`` returns bytes; it re-renders when the snapshot's ``seq`` changed, except that with a
    poll interval shorter than ``min_age`` seconds a render less than ``min_age`` old is served (see module doc),
    unless the source went up or down since (stale readings are withdrawn, and come back, at once).
    ``cached(fmt)`` (called by the server for each scrape, whose time and format it notes) returns the text when
    ``render()`` would not need to render, or the previous text while another thread renders the next one, else
    None. ``prerender(snap)`` is the poll thread's hook. ``gzipped(body)`` compresses a rendered body once.
    """

    def __init__(
        self,
        holder: SnapshotHolder,
        collectors: list[str],
        options: CollectOptions,
        min_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._holder = holder
        self._clock = clock
        self._scrapes: dict[str, _Scrapes] = {}  # by content type: every format scraped lately is rendered ahead
        self._lock = threading.Lock()
        self.min_age = min_age
        self.collectors = collectors
        self.options = options
        # per content type: (snapshot seq, source_up, monotonic render time, text)
        self._cache: dict[str, tuple[int, bool, float, bytes]] = {}
        self._texts: dict[str, TextWriter] = {}
        self._gz: dict[int, tuple[bytes, bytes]] = {}  # id(text) -> (text, its gzip), one per format at most

    def reconfigure(self, collectors: list[str], options: CollectOptions) -> None:
        """Use new collectors and options from the next render on (configuration reload)."""
        with self._lock:
            self.collectors = collectors
            self.options = options
            self._cache = {}
            self._texts = {}

    def families(self, snap: NodeSnapshot) -> Iterator[MetricFamily]:
        """Yield the families of ``snap`` that a render would encode (the enabled collectors' and per collector)."""
        return families(snap, self.collectors, self.options)

    def _valid(self, snap: NodeSnapshot, age_limit: float, fmt: Format) -> bytes | None:
        cached = self._cache.get(fmt.content_type)
        if cached is None:
            return None
        seq, up, at, body = cached
        if seq >= snap.seq:  # greater: the poll thread rendered the next snapshot just before publishing it
            return body
        if up == snap.source_up and snap.interval_seconds < self.min_age and self._clock() - at < age_limit:
            return body
        return None

    def cached(self, fmt: Format = PLAIN, gzip_ok: bool = False) -> bytes | None:
        """Note a scrape (its time, format and whether it takes gzip); return what ``render()`` would return if it
        needs no render (b"" before the first snapshot; at fast polls up to 2 x ``min_age`` old), else None."""
        now = self._clock()
        seen = self._scrapes.get(fmt.content_type)
        ahead = seen is not None and _rendering_ahead(seen, now)  # the poll thread renders this format ahead
        if seen is None:
            self._scrapes[fmt.content_type] = _Scrapes(fmt, now, None, gzip_ok)
        else:
            seen.gap, seen.last, seen.gzip = now - seen.last, now, gzip_ok
        snap = self._holder.snapshot
        if snap is None:
            return b""
        # at fast polls the poll thread re-renders once the text is min_age old (when it renders ahead, i.e. once the
        # scrape period is known); a scrape in between is served the text up to 2 x min_age old rather than render
        body = self._valid(snap, 2 * self.min_age if ahead else self.min_age, fmt)
        if body is None and self._lock.locked():
            # the poll thread is rendering this very snapshot: serve the previous poll's text rather than queue
            # behind a render that takes tens of ms at 64 GPUs (unless the source went up or down since)
            cached = self._cache.get(fmt.content_type)
            if cached is not None and cached[1] == snap.source_up:
                return cached[3]
        return body

    def prerender(self, snap: NodeSnapshot | None = None, poll_interval: float | None = None) -> bool:
        """Render ``snap`` (default the latest snapshot) now in each format scraped lately (a second scraper in
        another format is served ahead too) for which a scrape is expected before the next poll; return True when
        it rendered. ``poll_interval`` defaults to the snapshot's.

        Expected, per format: its last scrape plus the last gap between two of its scrapes comes before the next
        poll (``poll_interval`` from now) or has passed (a late scrape, or a gap that did not tell the period: a
        probe or a person's request between two of Prometheus's scrapes). After the first scrape, until a second
        one shows the period, every poll renders. Before any scrape, only the first render (plain text) is made.
        Once no scrape in a format has come for FIRST_GAP_MAX seconds, or two gaps if longer (that scraper
        stopped), it is not rendered ahead until its next scrape, which renders for itself. When the last scrape
        of a format took gzip, its text is compressed here too.
        """
        snap = snap if snap is not None else self._holder.snapshot
        if snap is None:
            return False
        interval = snap.interval_seconds if poll_interval is None else poll_interval
        now = self._clock()
        if not self._scrapes:
            if PLAIN.content_type in self._cache:
                return False
            self.render(snap, PLAIN)
            return True
        rendered = False
        for seen in list(self._scrapes.values()):
            have = seen.fmt.content_type in self._cache
            if have and now - seen.last > max(FIRST_GAP_MAX, 2 * (seen.gap or 0.0)):
                continue
            if seen.gap is not None and now + interval < seen.last + seen.gap:
                continue
            body = self.render(snap, seen.fmt)
            if seen.gzip:
                self.gzipped(body)
            rendered = True
        return rendered

    def render(self, snap: NodeSnapshot | None = None, fmt: Format = PLAIN) -> bytes:
        """Return the exposition of ``snap`` (default the latest snapshot) in ``fmt`` (b"" before the first
        snapshot)."""
        snap = snap if snap is not None else self._holder.snapshot
        if snap is None:
            return b""
        body = self._valid(snap, self.min_age, fmt)
        if body is not None:
            return body
        with self._lock:
            body = self._valid(snap, self.min_age, fmt)
            if body is not None:
                return body
            texts = self._texts.get(fmt.content_type)
            if texts is None:
                texts = self._texts[fmt.content_type] = TextWriter(fmt.openmetrics)
            body = texts.render(self.families(snap))
            self._cache[fmt.content_type] = (snap.seq, snap.source_up, self._clock(), body)
            return body

    def gzipped(self, body: bytes) -> bytes:
        """Return ``body`` gzip-compressed, compressing each rendered text once (the last of each format kept)."""
        gz = self._gz.get(id(body))
        if gz is not None and gz[0] is body:
            return gz[1]
        packed = gzip.compress(body, compresslevel=6)
        live = {id(entry[3]) for entry in self._cache.values()}
        self._gz = {k: v for k, v in self._gz.items() if k in live}  # texts no longer served
        self._gz[id(body)] = (body, packed)
        return packed


def gzip_accepted(accept_encoding: str) -> bool:
    """Return True when the ``Accept-Encoding`` value allows gzip (RFC 9110 section 12.5.3): ``gzip`` (or ``x-gzip``)
    listed with a q-value above 0, or ``*`` above 0 with gzip not listed. ``gzip;q=0`` refuses it.

    prometheus_client's own check and Starlette's GZipMiddleware look for the word only and ignore ``q=0``; no
    dependency parses the header's weights, so these few lines do. A malformed weight counts as 0 (not accepted).
    """
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # NaN and out-of-range weights are not weights
                    q = 0.0
        weights[coding.lower()] = q
    for coding in ("gzip", "x-gzip"):
        if coding in weights:
            return weights[coding] > 0
    return weights.get("*", 0.0) > 0


def respond(
    exposition: Exposition, accept: str | None, accept_encoding: str | None
) -> tuple[bytes | None, Format, bool]:
    """For a scrape's headers, return (the ready body or None when a render is needed, the format, gzip wanted)."""
    fmt = PLAIN if not accept else negotiate(accept)
    gz = gzip_accepted(accept_encoding or "")
    return exposition.cached(fmt, gz), fmt, gz
