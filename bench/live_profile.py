"""Where the CPU of the live poll goes, by function: cProfile over polls of real NVML, as the daemon builds them.

``python3 -m bench.live_profile [--polls 120] [--interval 1] [--top 30] [--time-only] [--what poll|render]`` opens
the NVML source, the analyzers and the default collectors that ``gpuwarden serve`` builds from the default
configuration, polls every ``--interval`` seconds (the cadences of GPM, slow readings and the host follow the clock,
as in the daemon) and renders the exposition after each poll (as a scrape each poll does); prints the CPU time
(``time.thread_time``: median, p90, mean) of the source alone, of the whole poll (source, analyzers, snapshot) and of
the render (the insight result, the collectors and the text), then the ``--top`` functions by their own time under
cProfile over the same kind of polls, profiling the poll or the render (``--what``).
Needs a GPU and its driver; the figures belong in docs/performance.md with the machine they come from.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.config import Config
from gpuwarden.daemon import build_analyzers, build_source
from gpuwarden.exposition import Exposition
from gpuwarden.poller import Poller
from gpuwarden.sdnotify import Notifier


def _figures(label: str, values: list[float]) -> str:
    s = sorted(values)
    return (
        f"{label}: median {statistics.median(s) * 1e3:.3f} ms, p90 {s[int(0.9 * (len(s) - 1))] * 1e3:.3f} ms, "
        f"mean {statistics.fmean(s) * 1e3:.3f} ms a poll"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the profile on this machine's GPUs; return 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=120)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--what", choices=("poll", "render"), default="poll", help="what cProfile profiles")
    args = ap.parse_args(argv)
    cfg = Config()
    source, _ = build_source(cfg)
    poller = Poller(source, args.interval, analyzers=build_analyzers(cfg), notifier=Notifier({}))
    poller.start(thread=False)
    expo = Exposition(poller, select_collectors(), CollectOptions())
    timed = source.poll

    def poll_source() -> object:
        start = time.thread_time()
        try:
            return timed()
        finally:
            spent.append(time.thread_time() - start)

    spent: list[float] = []
    source.poll = poll_source  # type: ignore[method-assign]
    whole: list[float] = []
    rendered: list[float] = []
    prof = cProfile.Profile()
    for phase in ("time", "profile"):
        if phase == "profile" and args.time_only:
            break
        for _ in range(args.polls):
            due = time.monotonic() + args.interval
            start = time.thread_time()
            if phase == "profile" and args.what == "poll":
                prof.enable()
            poller.poll_once()
            prof.disable()
            polled = time.thread_time()
            if phase == "profile" and args.what == "render":
                prof.enable()
            expo.render()
            prof.disable()
            if phase == "time":
                whole.append(polled - start)
                rendered.append(time.thread_time() - polled)
            time.sleep(max(0.0, due - time.monotonic()))
        if phase == "time":
            gpus = len(poller.snapshot.poll.gpus) if poller.snapshot and poller.snapshot.poll else 0
            print(f"{gpus} GPU(s), {args.polls} polls every {args.interval:g} s")
            print(_figures("NVML source", spent))
            print(_figures("whole poll (source, analyzers, snapshot)", whole))
            print(_figures("render (insight result, collectors, text)", rendered))
    if not args.time_only:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
    source.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
