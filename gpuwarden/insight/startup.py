"""A job's start-up: from its process's start to its first sustained kernels.

Before a training or inference loop runs, its process imports its libraries, creates the CUDA context, builds (or
loads) the model and starts its input pipeline: the GPU holds the context and idles while one core works, which is
what input starvation looks like. A verdict over a window that holds the start-up describes it, not the job; and a
recording that starts after it, replayed, gives another verdict than the live window did. So the analyzer keeps the
start-up apart: its time is the ``startup`` cause of ``gpu_idle_seconds_total``, the verdict while it lasts is
``starting``, and the job and diagnosis windows start anew when it ends (gpuwarden.insight.windows).

It ends at the first of:
- STARTUP_KERNEL_SECONDS of kernel time since the job appeared (util.gpu x seconds): a step of any job that uses the
  GPU adds kernel time, and the start-up's own kernels (weight initialisation, a first allocation) add milliseconds;
- kernels that recur: intervals with kernels STARTUP_RECUR_SECONDS apart or more. A loop runs kernels step after
  step, however short its kernels; the start-up's kernels come in one burst, then the GPU idles until the loop;
- held idle (the job's CPU quiet and no GPU work for the state's 5 s): nobody is starting anything (a notebook
  waiting for its user);
- STARTUP_MAX_SECONDS after the job's start: a start-up that takes longer is reported as what it does (reads,
  computes on the CPU, waits).

Only a job seen to arrive on a GPU (absent at the GPU's previous poll) has a start-up, and only when it is younger
than STARTUP_MAX_SECONDS: a job already there at the GPU's first poll (gpuwarden started after it, or a recording
made after it started) runs as it will, so live and a replay of the same polls agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.model import ProcessReading

#: Kernel seconds since the job appeared that end its start-up.
STARTUP_KERNEL_SECONDS = 1.0
#: Kernels in intervals at least this far apart (end of the later to start of the first, seconds) end it.
STARTUP_RECUR_SECONDS = 3.0
#: A start-up lasts at most this long after the job's first process started (seconds).
STARTUP_MAX_SECONDS = 300.0


@dataclass(slots=True)
class StartUp:
    """A job in its start-up on one GPU: its start (Unix s, the earliest start of its processes), the kernel seconds
    since it appeared and when the first interval with kernels began (Unix s; None: none yet)."""

    since: float
    kernel_seconds: float = 0.0
    first_kernels: float | None = None

    def age(self, now: float) -> float:
        """Seconds since the job started, at ``now`` (Unix s)."""
        return max(0.0, now - self.since)

    def ends(self, start: float, end: float, busy: float, held_idle: float, kernels: bool) -> bool:
        """Account the interval ``start``..``end`` (Unix s) with ``busy`` kernel seconds, ``held_idle`` seconds held
        idle and ``kernels``: whether any reading of the interval saw a kernel (a utilization sample or
        nvmlDeviceGetUtilizationRates above 0: kernels of microseconds show in one but not always in the other);
        return whether the start-up ends with it (the module's rules). Raises nothing."""
        self.kernel_seconds += busy
        if kernels or busy > 0:
            if self.first_kernels is None:
                self.first_kernels = start
            if self.kernel_seconds >= STARTUP_KERNEL_SECONDS or end - self.first_kernels >= STARTUP_RECUR_SECONDS:
                return True
        return held_idle * 2 >= end - start > 0 or self.age(end) >= STARTUP_MAX_SECONDS


#: Idle causes that keep their names in a start-up: nobody working, nobody holding, not visible, not readable.
KEPT_CAUSES = frozenset({"held_idle", "allocated_idle", "free", "unknown", "lost"})


def startup_causes(causes: dict[str, float]) -> dict[str, float]:
    """Return an interval's idle seconds by cause (gpuwarden.insight.vocabulary.states.idle_causes) as they count in a
    start-up: every cause but KEPT_CAUSES becomes ``startup`` (the job's CPU worked or waited while its GPU idled:
    that was the start-up, not input)."""
    out = {k: v for k, v in causes.items() if k in KEPT_CAUSES}
    out["startup"] = sum(v for k, v in causes.items() if k not in KEPT_CAUSES)
    return out


def begins(processes: Sequence[ProcessReading], now: float) -> StartUp | None:
    """Return the start-up of a job whose processes on a GPU are ``processes`` (seen first at ``now``, Unix s), or None
    when no start time is known or the job is older than STARTUP_MAX_SECONDS (its start-up is past). The job starts
    with its earliest process (/proc/PID/stat starttime)."""
    starts = [p.create_time for p in processes if p.create_time is not None]
    if not starts:
        return None
    since = min(starts)
    return StartUp(since) if now - since < STARTUP_MAX_SECONDS else None
