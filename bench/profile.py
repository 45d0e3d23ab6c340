"""Profile the poll path and the render path in-process over a replayed trace (cProfile).

``python3 -m bench.profile [--gpus 64] [--polls 200] [--top 25] [--what poll,render]`` builds the daemon's
pieces as ``gpuwarden serve --replay`` does (ReplaySource, the insight analyzer, the default collectors),
then times ``Poller.poll_once()`` (replay source + analyzers + snapshot) and ``Exposition.render()`` (a fresh
render per poll, as a scrape after each poll pays), prints per-call medians and p99, and the ``--top``
functions by cumulative time under cProfile. ``--check`` first compares the rendered bytes with
``prometheus_client.generate_latest``'s; ``--analyzer-steady INTERVAL`` times only the insight analyzer once its
300 s window is full at that poll interval.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.registry import Collector

from bench.traces import trace_for
from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.config import Config
from gpuwarden.daemon import build_analyzers
from gpuwarden.exposition import Exposition
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource
from gpuwarden.sdnotify import Notifier


class _All(Collector):
    """Every family of one render of the poller's latest snapshot, for one generate_latest over them all."""

    def __init__(self, expo: Exposition, poller: Poller) -> None:
        assert poller.snapshot is not None
        self._families = list(expo.families(poller.snapshot))

    def collect(self) -> list:  # type: ignore[type-arg]
        """Return the families."""
        return self._families


def quantiles(values: list[float]) -> tuple[float, float]:
    """Return (median, p99) of ``values`` (nearest rank)."""
    s = sorted(values)
    return statistics.median(s), s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def _without_durations(body: bytes) -> list[bytes]:
    return [line for line in body.splitlines() if not line.startswith(b"gpuwarden_scrape_collector_duration_seconds{")]


def build(trace: Path) -> tuple[Poller, Exposition]:
    """Return a started (threadless) Poller over ``trace`` and an Exposition with the default collectors, with what
    is alive after the start out of the garbage collector's sight (``gc.freeze``), as ``Daemon.start`` does."""
    cfg = Config()
    poller = Poller(ReplaySource(trace), 1.0, analyzers=build_analyzers(cfg), notifier=Notifier({}))
    poller.start(thread=False)
    expo = Exposition(poller, select_collectors(), CollectOptions())
    gc.collect()
    gc.freeze()
    return poller, expo


def time_paths(poller: Poller, expo: Exposition, polls: int) -> dict[str, tuple[float, float]]:
    """Return {"poll": (median, p99), "render": (median, p99), "steady": (median, p99) of the renders of the second
    half (every GPU's diagnosis window long enough for a verdict), "render_cpu": (median, p99) of the rendering
    thread's CPU time (``time.thread_time``: what a render costs, less what other load on a shared machine adds to
    its wall time), "bytes": (size, size)} over ``polls`` rounds."""
    tp, tr, tc = [], [], []
    size = 0
    for _ in range(polls):
        t0 = time.perf_counter()
        poller.poll_once()
        t1, c1 = time.perf_counter(), time.thread_time()
        body = expo.render()
        t2, c2 = time.perf_counter(), time.thread_time()
        tp.append(t1 - t0)
        tr.append(t2 - t1)
        tc.append(c2 - c1)
        size = len(body)
    return {
        "poll": quantiles(tp),
        "render": quantiles(tr),
        "steady": quantiles(tr[polls // 2 :]),
        "render_cpu": quantiles(tc),
        "bytes": (size, size),
    }


def analyzer_steady(trace: Path, interval: float, window: float = 300.0, rounds: int = 20) -> tuple[float, int]:
    """Return (median seconds of one InsightAnalyzer call, polls in its window) once its window is full.

    The trace's polls are re-stamped ``interval`` apart (timestamps, utilization samples, host time), so the
    analyzer holds what a daemon polling every ``interval`` holds after ``window`` seconds.
    """
    from gpuwarden.insight.analyzer import InsightAnalyzer

    src = ReplaySource(trace, timing="recorded")
    static = src.open()
    analyzer = InsightAnalyzer(window_seconds=window)
    n = int(window / interval) + 2
    t0 = None
    times: list[float] = []
    for k in range(n + rounds):
        p = src.poll()
        t0 = p.timestamp if t0 is None else t0
        poll = p.shifted(t0 + k * interval - p.timestamp)
        start = time.perf_counter()
        analyzer(poll, static)
        if k >= n:
            times.append(time.perf_counter() - start)
    return statistics.median(times), n


def main(argv: list[str] | None = None) -> int:
    """Run the profile; return 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--what", default="poll,render", help="which paths to profile: poll, render or both")
    ap.add_argument("--no-profile", action="store_true", help="timings only")
    ap.add_argument(
        "--analyzer-steady",
        type=float,
        metavar="INTERVAL",
        help="only time the insight analyzer with a full 300 s window at this poll interval",
    )
    ap.add_argument(
        "--check", action="store_true", help="also check the rendered bytes equal prometheus_client.generate_latest's"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = trace_for(args.gpus, Path(tmp))
        if args.analyzer_steady:
            sec, n = analyzer_steady(trace, args.analyzer_steady)
            print(
                f"{args.gpus} GPUs, poll every {args.analyzer_steady:g} s, {n} polls in the window: insight "
                f"analyzer {sec * 1e3:.2f} ms a poll = {100 * sec / args.analyzer_steady:.1f}% of one core"
            )
            return 0
        poller, expo = build(trace)
        for _ in range(40):  # warm up: fill the analyzer's window a little
            poller.poll_once()
            expo.render()
        if args.check:
            poller.poll_once()
            # the collectors' own durations differ from one render to the next: compare everything else
            same = _without_durations(expo.render()) == _without_durations(generate_latest(_All(expo, poller)))
            print(f"Exposition.render() == generate_latest: {same}")
            if not same:
                return 1
        t = time_paths(poller, expo, args.polls)
        print(
            f"{args.gpus} GPUs: poll median {t['poll'][0] * 1e3:.3f} ms p99 {t['poll'][1] * 1e3:.3f} ms; "
            f"render median {t['render'][0] * 1e3:.3f} ms p99 {t['render'][1] * 1e3:.3f} ms "
            f"(second half {t['steady'][0] * 1e3:.3f} / {t['steady'][1] * 1e3:.3f} ms; "
            f"CPU {t['render_cpu'][0] * 1e3:.3f} / {t['render_cpu'][1] * 1e3:.3f} ms); "
            f"exposition {t['bytes'][0]} bytes"
        )
        if args.no_profile:
            return 0
        what = set(args.what.split(","))
        prof = cProfile.Profile()
        for _ in range(args.polls):
            if "poll" in what:
                prof.enable()
            poller.poll_once()
            prof.disable()
            if "render" in what:
                prof.enable()
            expo.render()
            prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
