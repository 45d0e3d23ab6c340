"""The same instant questions asked at every tick of a range, answered by range queries: ``reclaim --report`` and the
reclaim controller's warm-up ask the accounting's questions (gpuwarden.cluster.usage.Accounting.idle_facts) at each
tick of hours or days; asked one tick at a time that is thousands of requests, while a range query
(``/api/v1/query_range``) is by definition the instant query evaluated at each of its steps.

SteppedQueries answers ``query(promql, at)`` for an ``at`` among the ticks from one range query of that PromQL over a
window of the ticks that starts there, and keeps each question's window until a tick past it is asked. Every other
time, and every question whose answer an engine moved off the ticks (a query front end that aligns ranges to its
step), is asked as the instant query it is, so the answers are the instant queries' wherever they come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuwarden.cluster.promapi import Prometheus, Sample, TooManySamples

#: The most ticks one range query covers (a day and 40 minutes at a 1-minute interval); a window whose answer holds
#: more than MAX_SAMPLES points (a large fleet) is halved until it fits.
WINDOW_TICKS = 1500


@dataclass
class _Window:
    """One question's answers over the ticks ``first`` to ``last`` (indexes into the ticks, inclusive)."""

    first: int
    last: int
    at: dict[int, list[Sample]] = field(default_factory=dict)


class SteppedQueries:
    """Instant queries at the ``ticks`` (Unix seconds, ascending, ``step`` seconds apart) through ``prom``, each
    question asked once per window of up to ``window`` ticks as a range query (see the module doc); ``requests``
    counts the requests sent. ``query`` raises PrometheusError as the client's do."""

    def __init__(self, prom: Prometheus, ticks: Sequence[float], step: float, window: int = WINDOW_TICKS) -> None:
        self.prom, self.step, self.window = prom, step, max(1, window)
        self.ticks = [round(t * 1000) for t in ticks]
        if any(b - a != round(step * 1000) for a, b in zip(self.ticks, self.ticks[1:], strict=False)):
            raise ValueError(f"ticks are not {step:g} s apart")
        self._index = {t: i for i, t in enumerate(self.ticks)}
        self._windows: dict[str, _Window] = {}
        self._instant: set[str] = set()  # questions an engine answered off the ticks
        self.requests = 0

    def query(self, promql: str, time: float | None = None) -> list[Sample]:
        """The vector of ``promql`` at ``time``: from the question's window where ``time`` is a tick, else asked as an
        instant query."""
        i = None if time is None else self._index.get(round(time * 1000))
        if i is None or promql in self._instant:
            return self._ask(promql, time)
        win = self._windows.get(promql)
        if win is None or not win.first <= i <= win.last:
            win = self._fetch(promql, i)
            if win is None:
                return self._ask(promql, time)
        return win.at.get(self.ticks[i], [])

    def _ask(self, promql: str, time: float | None) -> list[Sample]:
        self.requests += 1
        return self.prom.query(promql, time)

    def _fetch(self, promql: str, i: int) -> _Window | None:
        """Ask ``promql`` over the window of ticks from index ``i``, halving it while the answer is too large; None
        (and the question asked instantly from then on) where the engine answered at times that are not the ticks."""
        self._windows.pop(promql, None)  # the old window's answers go before the next one's come
        while True:
            last = min(len(self.ticks) - 1, i + self.window - 1)
            self.requests += 1
            try:
                at = self.prom.query_range(promql, self.ticks[i] / 1000, self.ticks[last] / 1000, self.step)
            except TooManySamples:
                if self.window == 1:
                    raise
                self.window = max(1, self.window // 2)
                continue
            if any(t not in self._index or not i <= self._index[t] <= last for t in at):
                self._instant.add(promql)
                return None
            win = self._windows[promql] = _Window(i, last, at)
            return win
