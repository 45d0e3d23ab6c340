"""When the exposition is rendered: once per poll, at most once per ``min_age`` when polls are faster,
and in the poll thread (Poller.on_publish) so that scrapes find the text ready."""

from __future__ import annotations

import pytest
from conftest import trace
from prometheus_client import generate_latest
from prometheus_client.registry import Collector

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.config import Config
from gpuwarden.daemon import build_analyzers
from gpuwarden.exposition import PLAIN, Exposition
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource

H100 = trace("h100-compute_bound")


def _without_durations(body: bytes) -> list[bytes]:
    return [x for x in body.splitlines() if not x.startswith(b"gpuwarden_scrape_collector_duration_seconds{")]


def _polls_in(text: bytes) -> float:
    line = next(x for x in text.decode().splitlines() if x.startswith("gpuwarden_polls_total "))
    return float(line.split()[1])


def test_scraped_every_poll_each_poll_is_rendered_in_the_poll_thread() -> None:
    now = [0.0]
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions(), clock=lambda: now[0])
    p.on_publish = lambda snap: exp.prerender(snap)
    p.start(thread=False)
    first = exp.cached()  # a scrape at 0 s
    assert first is not None and _polls_in(first) == 1  # rendered by the hook, before any scrape
    for polls in (2, 3, 4, 5):
        now[0] += 0.9
        p.poll_once()  # each poll renders ahead of the next scrape (before the period is known, too)
        now[0] += 0.1
        body = exp.cached()
        assert body is not None and _polls_in(body) == polls
        assert exp.render() is body  # a scrape reuses the poll thread's render


def test_fast_polls_are_rendered_at_most_once_per_min_age() -> None:
    now = [0.0]
    p = Poller(ReplaySource(H100, timing="recorded"), 0.1)
    exp = Exposition(p, select_collectors(), CollectOptions(), clock=lambda: now[0])
    p.on_publish = lambda snap: exp.prerender(snap, 0.1)
    p.start(thread=False)  # t = 0: the first render
    seen = []
    for k in range(1, 11):  # polls every 0.1 s, a scrape 0.05 s after each
        now[0] = round(k * 0.1, 2)
        p.poll_once()
        now[0] += 0.05
        body = exp.cached()
        assert body is not None
        seen.append(_polls_in(body))
    assert seen == [1] * 9 + [11]  # the text made at 0 s serves every scrape until it is 1 s old
    # without the poll thread, a scrape takes text up to 2 x min_age old, then renders for itself
    p.on_publish = None
    now[0] = 1.5
    p.poll_once()
    now[0] = 1.9
    body = exp.cached()
    assert body is not None and _polls_in(body) == 11
    now[0] = 3.1
    assert exp.cached() is None


def test_a_new_snapshot_with_a_slow_poll_is_never_served_stale() -> None:
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions())
    p.start(thread=False)  # no hook: scrapes render on demand
    assert _polls_in(exp.render()) == 1
    p.poll_once()
    assert exp.cached() is None
    assert _polls_in(exp.render()) == 2


def test_with_periodic_scrapes_only_the_poll_before_a_scrape_renders_ahead() -> None:
    now = [0.0]
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions(), clock=lambda: now[0])
    p.start(thread=False)
    assert exp.prerender()  # the first render
    p.poll_once()
    assert not exp.prerender()  # nobody has scraped: nothing rendered ahead
    assert exp.cached() is None  # the first scrape (at 0 s) renders for itself
    exp.render()
    for t in range(1, 15):
        now[0] = float(t)
        p.poll_once()
        assert exp.prerender()  # one scrape does not tell when the next comes: every poll renders
    now[0] = 15.0  # Prometheus scrapes every 15 s
    assert exp.cached() is not None
    rendered = []
    for t in range(16, 30):  # polls every second until the next scrape, due at 30 s
        now[0] = float(t)
        p.poll_once()
        rendered.append(exp.prerender())
    assert rendered == [False] * 13 + [True]  # only the poll at 29 s renders
    now[0] = 30.0
    body = exp.cached()
    assert body is not None and _polls_in(body) == p.snapshot.polls_total
    # a late scrape: polls past the due time render ahead until it comes, for FIRST_GAP_MAX (120 s) at most
    now[0] = 46.0
    p.poll_once()
    assert exp.prerender()
    now[0] = 149.0
    p.poll_once()
    assert exp.prerender()
    now[0] = 151.0  # scrapes stopped (Prometheus is down): no more rendering ahead
    p.poll_once()
    assert not exp.prerender()


def test_an_irregular_scrape_does_not_leave_the_next_periodic_scrape_to_render_for_itself() -> None:
    """A request 0.2 s after a scrape (a readiness probe, a person's curl) makes the last gap 0.2 s: the polls after
    it keep rendering ahead, so Prometheus's next scrape, 15 s later, still finds its text ready."""
    now = [0.0]
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions(), clock=lambda: now[0])
    p.start(thread=False)
    exp.render()
    for t in (0.0, 15.0, 30.0, 30.2):  # Prometheus every 15 s, then a stray request
        now[0] = t
        exp.cached()
    for t in range(31, 45):
        now[0] = float(t)
        p.poll_once()
        assert exp.prerender()
    now[0] = 45.0
    body = exp.cached()
    assert body is not None and _polls_in(body) == p.snapshot.polls_total


def test_a_daemon_nobody_scrapes_twice_stops_rendering_ahead() -> None:
    now = [0.0]
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions(), clock=lambda: now[0])
    p.start(thread=False)
    exp.render()
    exp.cached()  # one scrape at 0 s, then none
    now[0] = 100.0
    p.poll_once()
    assert exp.prerender()
    now[0] = 121.0
    p.poll_once()
    assert not exp.prerender()


def test_the_poll_thread_renders_a_snapshot_before_it_is_published() -> None:
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions())
    seen: list[bool] = []

    early: list[bytes | None] = []

    def hook(snap) -> None:  # noqa: ANN001
        seen.append(p.snapshot is None or p.snapshot.seq < snap.seq)  # not yet published
        exp.prerender(snap)
        if p.snapshot is not None:
            early.append(exp.cached())  # a scrape between the render and the publication

    p.on_publish = hook
    p.start(thread=False)
    assert exp.cached() is not None  # a first scrape
    p.poll_once()
    assert seen and all(seen)
    # that scrape got the text just made (one poll newer than what is published), not a render of its own
    assert early and early[-1] is not None and _polls_in(early[-1]) == 2
    body = exp.cached()  # published and already rendered
    assert body is not None and _polls_in(body) == 2


def test_a_scrape_during_a_render_gets_the_previous_text_at_once() -> None:
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions())
    p.start(thread=False)
    first = exp.render()
    p.poll_once()
    with exp._lock:  # as while the poll thread renders the new snapshot
        assert exp.cached() is first
    assert exp.cached() is None  # no render under way: the new snapshot must be rendered
    assert _polls_in(exp.render()) == 2


class _All(Collector):
    """Every family of one render, for a single generate_latest over them all."""

    def __init__(self, exp: Exposition, snap) -> None:  # noqa: ANN001
        self._families = list(exp.families(snap))

    def collect(self):  # noqa: ANN201
        return self._families


@pytest.mark.parametrize("name", ["h200x2-ddp_straggler", "h100-compute_bound", "derived-8gpu", "h200x2-nvlink"])
@pytest.mark.parametrize("om", [False, True], ids=["text", "openmetrics"])
def test_the_writer_is_byte_for_byte_prometheus_clients_encoder_at_every_poll(name: str, om: bool) -> None:
    """gpuwarden's TextWriter (series' name-and-labels text kept, values formatted per render) writes, at every poll
    of real recordings, in both formats, exactly what prometheus_client's own encoder writes over the same families
    (but for the collector durations, which differ between two renders)."""
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from gpuwarden.exposition import negotiate

    fmt = negotiate("application/openmetrics-text; version=1.0.0") if om else PLAIN
    encode = om_latest if om else generate_latest
    p = Poller(ReplaySource(trace(name), timing="recorded"), 1.0, analyzers=build_analyzers(Config()))
    exp = Exposition(p, select_collectors(), CollectOptions())
    p.start(thread=False)
    for _ in range(40):
        p.poll_once()
        ours = exp.render(fmt=fmt)
        assert _without_durations(ours) == _without_durations(encode(_All(exp, p.snapshot)))


def test_hostile_label_values_and_help_text_are_escaped_as_prometheus_client_escapes_them() -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from gpuwarden.families import MetricFamily, TextWriter

    hostile = 'a\\b"c\nd\x1b[2J\u00e9{}=,'
    gauge = MetricFamily("x_ratio", 'X "quoted" \\ and\nmore.', "gauge", ("gpu", "name"))
    gauge.add_metric(["0", hostile], 0.5)
    gauge.add_metric(["1", ""], float("nan"))
    counter = MetricFamily("y", "Y.", "counter", ("gpu",))
    counter.add_metric(["0"], 1e21)
    info = MetricFamily("z", "Z.", "info", ("gpu",))
    info.add_metric(["0"], {"version": hostile, "b": "1"})

    class All:
        def collect(self) -> list:  # noqa: ANN401
            return [gauge, counter, info]

    for om, encode in ((False, generate_latest), (True, om_latest)):
        writer = TextWriter(om)
        assert writer.render(All().collect()) == encode(All()), om
        assert writer.render(All().collect()) == encode(All()), om  # and again, from its kept text


def test_a_series_gone_from_the_exposition_is_forgotten() -> None:
    from gpuwarden.families import MetricFamily, TextWriter

    writer = TextWriter(False)

    def fam(*pids: str) -> MetricFamily:
        g = MetricFamily("p_bytes", "P.", "gauge", ("pid",))
        for pid in pids:
            g.add_metric([pid], 1.0)
        return g

    assert (
        writer.render([fam("1", "2")])
        == b'# HELP p_bytes P.\n# TYPE p_bytes gauge\np_bytes{pid="1"} 1.0\np_bytes{pid="2"} 1.0\n'
    )
    writer.render([fam("2", "3")])
    assert writer._kept["p_bytes"].prefixes == ['p_bytes{pid="2"} ', 'p_bytes{pid="3"} ']  # pid 1's text went
    assert writer.render([]) == b""


def test_two_scrapers_in_two_formats_are_both_rendered_ahead() -> None:
    """Prometheus in the text format and a second scraper in OpenMetrics, each every 15 s: after each poll before
    their scrapes, both texts are ready (neither scrape renders on the request path), each gzipped once."""
    from gpuwarden.exposition import negotiate

    openmetrics = negotiate("application/openmetrics-text; version=1.0.0")
    now = [0.0]
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(p, select_collectors(), CollectOptions(), clock=lambda: now[0])
    p.on_publish = lambda snap: exp.prerender(snap)
    p.start(thread=False)
    for _ in range(3):  # two periods seen for each format
        exp.cached(PLAIN, gzip_ok=True)
        now[0] += 0.5
        exp.cached(openmetrics, gzip_ok=True)
        for _ in range(15):
            now[0] += 1.0
            p.poll_once()
        now[0] -= 0.5
    assert p.snapshot is not None
    seq = p.snapshot.seq
    plain, om = exp.cached(PLAIN, gzip_ok=True), None
    now[0] += 0.5
    om = exp.cached(openmetrics, gzip_ok=True)
    assert plain is not None and om is not None and plain != om and om.endswith(b"# EOF\n")
    assert _polls_in(plain) == _polls_in(om) == seq  # both the latest poll's, rendered ahead
    assert exp.gzipped(plain) is exp.gzipped(plain) and exp.gzipped(om) is exp.gzipped(om)


def test_numbers_of_every_range_are_written_as_prometheus_client_writes_them() -> None:
    """Every number the writer formats (a column of small numbers at C level, kept texts for large ones, NaN and
    the infinities) is prometheus_client's text, in both formats and again from the kept texts; -0.0 after 0.0
    and a large number after its neighbour keep their own text."""
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from gpuwarden.families import MetricFamily, TextWriter

    numbers = [0.0, -0.0, 1e6, 999999.9, 2e6, 123456789.0, 1e16, 1e21, 5e-324, -7e8, float("inf"), float("-inf"),
               float("nan"), 1.5e6, 1.5e6 + 1]  # fmt: skip
    mixed = MetricFamily("mixed", "M.", "gauge", ("i",))
    for i, v in enumerate(numbers):
        mixed.add_metric([str(i)], v)
    small = MetricFamily("small", "S.", "gauge", ("i",))
    for i, v in enumerate([0.0, -0.0, 0.25, 999999.0, -3.0]):
        small.add_metric([str(i)], v)

    class All:
        def collect(self) -> list:  # noqa: ANN401
            return [mixed, small]

    for om, encode in ((False, generate_latest), (True, om_latest)):
        writer = TextWriter(om)
        for _ in range(2):
            assert writer.render(All().collect()) == encode(All()), om


def test_a_family_rendered_again_with_any_bit_changed_is_prometheus_clients_text_of_the_new_numbers() -> None:
    """A family rendered again with the same series (its name-and-labels texts kept) and numbers changed in any bit
    (0.0 to -0.0, a NaN, the last digit of a large number) gives prometheus_client's text of the new numbers, in both
    formats."""
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from gpuwarden.families import MetricFamily, TextWriter

    def fam(*values: float) -> MetricFamily:
        g = MetricFamily("v", "V.", "gauge", ("i",))
        for i, v in enumerate(values):
            g.add_metric([str(i)], v)
        return g

    rounds = [(0.0, 1.0, 2e6), (0.0, 1.0, 2e6), (-0.0, 1.0, 2e6), (-0.0, float("nan"), 2e6), (-0.0, float("nan"), 2e6),
              (-0.0, float("nan"), 2000000.0000000002), (0.0, 1.0, 2e6)]  # fmt: skip
    for om, encode in ((False, generate_latest), (True, om_latest)):
        writer = TextWriter(om)
        for values in rounds:
            f = fam(*values)

            class One:
                def collect(self) -> list:  # noqa: ANN401
                    return [f]  # noqa: B023

            assert writer.render([f]) == encode(One()), (om, values)


@pytest.mark.parametrize("name", ["h200x2-ddp_straggler", "derived-8gpu-lost", "derived-h100-health"])
def test_both_formats_parse_strictly_and_carry_the_same_samples(name: str) -> None:
    """At every poll of real recordings (a lost GPU and health findings among them), OpenMetrics passes
    prometheus_client's OpenMetrics parser (strict: one # EOF last, counters' _total, no sample without its family)
    and the text format its text parser, and the two carry the same samples with the same values."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwarden.exposition import negotiate

    om = negotiate("application/openmetrics-text; version=1.0.0")
    p = Poller(ReplaySource(trace(name), timing="recorded"), 1.0, analyzers=build_analyzers(Config()))
    exp = Exposition(p, select_collectors(), CollectOptions())
    p.start(thread=False)
    diagnosed = 0
    for _ in range(30):
        p.poll_once()

        def samples(families: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in families  # type: ignore[attr-defined]
                for s in f.samples
                if not s.name.startswith("gpuwarden_scrape_collector_duration")
            }

        text = samples(text_string_to_metric_families(exp.render(fmt=PLAIN).decode()))
        openmetrics = samples(om_families(exp.render(fmt=om).decode()))
        # the text format names an info family's samples NAME_info and a counter's NAME_total, as OpenMetrics does
        assert text.keys() == openmetrics.keys()
        assert all(text[k] == openmetrics[k] or (text[k] != text[k] and openmetrics[k] != openmetrics[k]) for k in text)
        diagnosed += sum(1 for (n, _), v in text.items() if n == "gpu_diagnosis" and v == 1.0)
    assert diagnosed > 0
