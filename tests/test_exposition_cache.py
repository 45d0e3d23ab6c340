"""When the exposition is rendered: once per poll, at most once per ``min_age`` when polls are faster,
and in the poll thread (Poller.on_publish) so that scrapes find the text ready."""

from __future__ import annotations

import time

from conftest import trace

from exporter.collectors import CollectOptions
from exporter.exposition import Exposition, select_collectors
from exporter.poller import Poller
from exporter.replay import ReplaySource

H100 = trace("h100-compute_bound")


def _polls_in(text: bytes) -> float:
    line = next(x for x in text.decode().splitlines() if x.startswith("gpuwarden_polls_total "))
    return float(line.split()[1])


def _setup(interval: float, min_age: float = 1.0) -> tuple[Poller, Exposition]:
    p = Poller(ReplaySource(H100, timing="recorded"), interval)
    exp = Exposition(lambda: p.snapshot, select_collectors(), CollectOptions(), min_age=min_age)
    p.on_publish = lambda: exp.prerender(interval)
    p.start(thread=False)
    return p, exp


def test_each_poll_is_rendered_in_the_poll_thread_at_a_one_second_poll() -> None:
    p, exp = _setup(1.0)
    first = exp.cached()
    assert first is not None and _polls_in(first) == 1  # rendered by the hook, before any scrape
    p.poll_once()
    second = exp.cached()
    assert second is not None and _polls_in(second) == 2
    assert exp.render() is second  # a scrape reuses the poll thread's render


def test_fast_polls_are_rendered_at_most_once_per_min_age() -> None:
    p, exp = _setup(0.1, min_age=0.2)
    for _ in range(3):
        p.poll_once()
    text = exp.render()
    assert _polls_in(text) == 1, "polls within min_age of the last render reuse it"
    time.sleep(0.25)
    assert _polls_in(exp.cached()) == 1  # older than min_age: a scrape still gets it (up to 2 x min_age)...
    p.poll_once()  # ... while the next poll renders again
    text = exp.cached()
    assert text is not None and _polls_in(text) == 5
    p.on_publish = None
    time.sleep(0.45)
    p.poll_once()
    assert exp.cached() is None  # a newer snapshot and the text past 2 x min_age: a scrape renders itself


def test_a_new_snapshot_with_a_slow_poll_is_never_served_stale() -> None:
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(lambda: p.snapshot, select_collectors(), CollectOptions())
    p.start(thread=False)  # no hook: scrapes render on demand
    assert _polls_in(exp.render()) == 1
    p.poll_once()
    assert exp.cached() is None
    assert _polls_in(exp.render()) == 2


def test_with_periodic_scrapes_only_the_poll_before_a_scrape_renders_ahead() -> None:
    now = [0.0]
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(lambda: p.snapshot, select_collectors(), CollectOptions(), clock=lambda: now[0])
    p.start(thread=False)
    assert exp.prerender(1.0)  # nobody scraped yet: render ahead
    for t in (0.0, 15.0):  # Prometheus scrapes every 15 s
        now[0] = t
        p.poll_once()
        exp.prerender(1.0)
        assert exp.cached() is not None
    rendered = []
    for t in range(16, 30):  # polls every second until the next scrape, due at 30 s
        now[0] = float(t)
        p.poll_once()
        rendered.append(exp.prerender(1.0))
    assert rendered == [False] * 13 + [True]  # only the poll at 29 s renders
    now[0] = 30.0
    body = exp.cached()
    assert body is not None and _polls_in(body) == p.snapshot.polls_total
    # a late scrape: every poll past the due time renders ahead until it comes
    now[0] = 46.0
    p.poll_once()
    assert exp.prerender(1.0)


def test_a_scrape_during_a_render_gets_the_previous_text_at_once() -> None:
    p = Poller(ReplaySource(H100, timing="recorded"), 1.0)
    exp = Exposition(lambda: p.snapshot, select_collectors(), CollectOptions())
    p.start(thread=False)
    first = exp.render()
    p.poll_once()
    with exp._lock:  # as while the poll thread renders the new snapshot
        assert exp.cached() is first
    assert exp.cached() is None  # no render under way: the new snapshot must be rendered
    assert _polls_in(exp.render()) == 2
