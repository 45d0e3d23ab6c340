"""The reclaim ladder, one tick at a time: which jobs have left their GPUs idle for how long, and which step each has
reached. No I/O: the facts of each tick come from Prometheus (gpuwarden.cluster.usage.Accounting.idle_facts), the
decisions go to gpuwarden.reclaim.actions.

A tick (the policy's ``interval``) is **idle** for a job when, over it,

- the job held each of its GPUs (accounted seconds in every state but free, while it held them) at least
  ``coverage`` of the tick - a job that just started or left a GPU is not judged on a part;
- at least ``idle_share`` of that held time went to the reclaimable idle causes (by default ``held_idle``: memory held,
  no kernel, the job's CPU quiet; and ``paused``: the job stopped right after GPU work) - so a job that is starved
  (its GPU waits on input the job is working on: ``input_cpu``, ``input_io``), launch bound, checkpointing or starting
  never has an idle tick, whatever its utilization;
- no GPU of the job was given a verdict outside ``climbing_verdicts`` (by default ``held_idle`` and ``job_paused``) at
  any of the tick's diagnosis samples: ``input_starved``, ``launch_bound``, ``waiting_on_peers``,
  ``checkpoint_bound`` and every other verdict of a working job stop the climb.

A job whose GPUs were given ``serving_idle`` (a live server that says nobody asks it: NOTICE_ONLY_VERDICTS) climbs
the first step only, where a policy lists that verdict and cause at all (the default does not).

A job is then idle since the start of its run of idle ticks; it reaches step ``i`` once idle for the step's
``after`` and, past the first step, at least ``after[i] - after[i-1]`` after it reached step ``i - 1`` (so the owner
has the time between the steps to answer the notice, even when the ladder starts late). One tick that is not idle
ends the run: the job starts again from the bottom (a ``reset`` decision where it had climbed). A multi-node job is
one job: all its GPUs, on every node, are weighed together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuwarden.cluster.usage import IdleFacts, JobKey
from gpuwarden.reclaim.policy import Policy

#: The decision a job gets when it works again after climbing.
RESET = "reset"
#: The verdict of a server that says it has had no request (gpuwarden.server_requests): a job given it for one of its
#: GPUs climbs the first step alone (the notice), wherever the policy lets idle servers climb: whether a live server is
#: scaled to zero or stopped is its owner's decision.
NOTICE_ONLY_VERDICTS = frozenset({"serving_idle"})


@dataclass
class JobState:
    """A job on the ladder: idle since (Unix seconds), and the steps taken, each with its time."""

    idle_since: float
    taken: list[tuple[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    """A step a job reached at ``time`` (Unix seconds), or ``reset`` (it worked again after climbing), with how long
    it had been idle (``idle_seconds``), the tick's facts and the evidence in words (``evidence``)."""

    time: float
    key: JobKey
    step: str
    index: int
    idle_seconds: float
    facts: IdleFacts
    evidence: str


class Ladder:
    """The ladder of ``policy`` over the jobs it has seen (see the module doc)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.jobs: dict[JobKey, JobState] = {}
        self._blocking = policy.blocking_verdicts()

    def idle(self, facts: IdleFacts, tick_seconds: float) -> tuple[bool, str]:
        """Whether a tick of ``tick_seconds`` with ``facts`` is idle for the job, and the evidence in words."""
        p = self.policy
        n = len(facts.gpus)
        held = facts.held_seconds
        share = facts.reclaimable_seconds / held if held > 0 else 0.0
        blocked = sorted(facts.reasons & self._blocking)
        words = (
            f"held {n} GPU(s) for {held:.0f} GPU-s of a {tick_seconds:.0f} s tick, {share:.0%} of it idle "
            f"({'+'.join(p.reclaimable_causes)}), verdicts {','.join(sorted(facts.reasons)) or 'none'}"
        )
        if n == 0 or held < p.coverage * n * tick_seconds:
            return False, words + f": held less than {p.coverage:.0%} of the tick"
        if share < p.idle_share:
            return False, words + f": idle below {p.idle_share:.0%}"
        if blocked:
            return False, words + f": {', '.join(blocked)} (a working job never climbs)"
        return True, words

    def tick(
        self, time: float, tick_seconds: float, facts: Mapping[JobKey, IdleFacts], climb: bool = True
    ) -> list[Decision]:
        """Weigh the tick that ends at ``time`` (Unix seconds) with each job's ``facts``; return the decisions: steps
        reached and resets. With ``climb`` False (warming up on history) only idle runs are followed, no step taken.
        A job absent from ``facts`` (it ended, or left its GPUs) leaves the ladder."""
        steps = self.policy.steps
        out: list[Decision] = []
        for key, f in sorted(facts.items()):
            if self.policy.exempt(key.job_id):
                continue
            idle, evidence = self.idle(f, tick_seconds)
            state = self.jobs.get(key)
            if not idle:
                if state is not None and state.taken:
                    out.append(Decision(time, key, RESET, -1, time - state.idle_since, f, evidence))
                self.jobs.pop(key, None)
                continue
            if state is None:
                state = self.jobs[key] = JobState(idle_since=time - tick_seconds)
            k = len(state.taken)
            top = 1 if f.reasons & NOTICE_ONLY_VERDICTS else len(steps)
            if not climb or k >= top:
                continue
            idle_for = time - state.idle_since
            gap = steps[k].after_seconds - (steps[k - 1].after_seconds if k else 0.0)
            waited = idle_for if k == 0 else time - state.taken[-1][1]
            if idle_for >= steps[k].after_seconds and waited >= gap:
                state.taken.append((steps[k].name, time))
                out.append(Decision(time, key, steps[k].name, k, idle_for, f, evidence))
        for key in [k for k in self.jobs if k not in facts]:
            del self.jobs[key]
        return out

    def position(self, key: JobKey) -> str | None:
        """The last step ``key`` took (None: not on the ladder, or not past its first step yet)."""
        state = self.jobs.get(key)
        return state.taken[-1][0] if state is not None and state.taken else None
