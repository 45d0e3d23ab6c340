"""A job's start-up is its own phase, kept out of the steady verdict; verdicts near a threshold say so and hold.

The start-up shapes are derived (modified) from real H100 recordings: a free GPU (``h100-idle``), then the job's
first recorded poll repeated for S seconds with no kernel (utilization and its samples 0) while its process burns a
core (its CPU time growing one second per second: imports, CUDA context, model build), then the job's recording as
it was made. A recording made after the start-up is the same job seen without it: the live daemon sees the first,
a replay of that recording the second, and both must give the same steady verdict.
"""

from __future__ import annotations

import pytest
from test_insight_helpers import TRACES, h100, run

from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.insight.diagnosis import diagnose
from gpuwarden.insight.gpu_window import GpuWindow
from gpuwarden.insight.margins import MARGIN, VerdictMemory, alternatives
from gpuwarden.insight.startup import STARTUP_MAX_SECONDS, STARTUP_RECUR_SECONDS, StartUp, begins
from gpuwarden.model import GpuReading, NodeStatic, PollResult, ProcessReading
from gpuwarden.trace import read_trace


def _starting(first: GpuReading, at: float, k: int, since: float, cpu0: float) -> GpuReading:
    """The job's first poll as it would read ``k`` seconds into a start-up that began at ``since``: no kernel, its
    processes started at ``since``, the first one's CPU growing a core a second (the others' as recorded)."""
    procs = []
    for i, p in enumerate(first.processes or ()):
        cpu = cpu0 + k if i == 0 else p.cpu_seconds_total
        tree = None if p.tree_cpu_seconds_total is None else (cpu0 + k if i == 0 else p.tree_cpu_seconds_total)
        procs.append(
            p.model_copy(update={"create_time": since, "cpu_seconds_total": cpu, "tree_cpu_seconds_total": tree})
        )
    return first.model_copy(
        update={
            "timestamp": at,
            "utilization_gpu_ratio": 0.0,
            "utilization_samples": [(at - 1 + j / 6, 0.0) for j in range(6)],
            "processes": procs,
            "gpm": {},
        }
    )


def spliced(job: str, startup: int) -> tuple[NodeStatic, list[PollResult], int]:
    """10 free polls, ``startup`` start-up polls, then the job's recording (1 s apart); returns the node, the polls
    and the index of the job's first recorded poll."""
    _, free = read_trace(h100("idle"))
    header, polls = read_trace(TRACES / f"{job}.jsonl.gz")
    t0 = polls[0].timestamp - startup - 10
    out = [p.shifted(t0 + i - p.timestamp) for i, p in enumerate(free[:10])]
    uuid = header.node.gpus[0].uuid
    out = [p.model_copy(update={"gpus": [g.model_copy(update={"uuid": uuid}) for g in p.gpus]}) for p in out]
    first = polls[0].gpus[0]
    since = polls[0].timestamp - startup - 0.5
    for k in range(startup):
        at = polls[0].timestamp - startup + k
        g = _starting(first, at, k, since, cpu0=0.5)
        out.append(PollResult(timestamp=at, duration_seconds=0.01, gpus=[g], host=polls[0].host))
    return header.node, out + [_started_at(p, since, 0.5 + startup) for p in polls], len(out)


def _started_at(p: PollResult, since: float, cpu: float) -> PollResult:
    """Poll ``p`` of a job whose processes started at ``since``, the first one ``cpu`` CPU seconds further on."""
    gpus = []
    for g in p.gpus:
        procs = [
            q.model_copy(update={"create_time": since, "cpu_seconds_total": (q.cpu_seconds_total or 0) + cpu})
            if i == 0
            else q
            for i, q in enumerate(g.processes or ())
        ]
        gpus.append(g.model_copy(update={"processes": procs}))
    return p.model_copy(update={"gpus": gpus})


JOBS = {
    "h100-k-loader-workers-workers-0": "input_starved",
    "h100-k-bf16-matmul": "compute_bound",
    "h100-k-self-paused-busy-2-pause-2": "job_paused",
    "h100-k-remote-reader-workers-4-size-4096": "input_starved",
}


@pytest.mark.parametrize("startup", [4, 15, 40])
@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_start_up_is_starting_then_the_steady_verdict_is_the_recordings(job: str, startup: int) -> None:
    node, polls, first = spliced(job, startup)
    results = run(polls, node)
    during = [r.gpus[0].diagnosis for r in results[10 + 2 : first]]  # 2 s of history before any verdict
    assert during and all(d is not None and d.verdict == "starting" for d in during), [d and d.verdict for d in during]
    assert during[-1] is not None and "imports, CUDA context" in during[-1].summary
    # its idle time is the start-up's, not input's: the seconds of the start-up within one poll
    idle = results[first].gpus[0].idle_seconds_total
    assert startup - 1.5 <= idle["startup"] <= startup + 1.5, idle
    assert idle["input_cpu"] + idle["input_io"] + idle["input"] < 1.5, idle
    # the steady verdict: the expected one, and the one the recording alone (made after the start-up) gets
    live = results[-1].gpus[0].diagnosis
    header, alone = read_trace(TRACES / f"{job}.jsonl.gz")
    replayed = run(alone, header.node)[-1].gpus[0].diagnosis
    assert live is not None and replayed is not None
    assert live.verdict == replayed.verdict == JOBS[job]
    # the start-up ends within STARTUP_RECUR_SECONDS of the job's first kernels (a poll more for the interval; some
    # recordings begin before them: the tail of the workload's own start-up), and no steady verdict is given from
    # the start-up's numbers: the last verdicts are all the job's
    kernels = next(i for i, p in enumerate(polls[first:]) if p.gpus[0].utilization_gpu_ratio)
    after = [r.gpus[0].diagnosis for r in results[first + kernels :]]
    verdicts = [d.verdict for d in after if d is not None]
    assert "starting" not in verdicts[int(STARTUP_RECUR_SECONDS) + 2 :], verdicts
    assert verdicts[-5:] == [JOBS[job]] * 5, verdicts


def test_the_daemon_replaying_a_recording_gives_the_verdicts_of_the_analyzer_fed_the_same_polls() -> None:
    """The daemon's replay (re-stamped polls through the poller, results built when read) and the analyzer fed the
    recording's polls directly decide the same at every poll, start-up included (the demo's jobs arrive in turn)."""
    from conftest import replay_poller

    from gpuwarden.insight.vocabulary.result import snapshot_insight
    from gpuwarden.replay import demo_trace_path

    path = demo_trace_path()
    header, polls = read_trace(path)
    direct = run(polls, header.node)
    analyzer = InsightAnalyzer()
    poller = replay_poller(path, 1, analyzers={"insight": analyzer.prepare})
    served = []
    for i in range(len(polls)):
        if i:
            poller.poll_once()
        assert poller.snapshot is not None
        served.append(snapshot_insight(poller.snapshot))
    starting = compared = 0
    for a, b in zip(direct, served, strict=True):
        if b is None:  # the daemon's first poll reads the node; the analyzer starts with the second
            continue
        compared += 1
        for x, y in zip(a.gpus, b.gpus, strict=True):
            vx = None if x.diagnosis is None else (x.diagnosis.verdict, x.diagnosis.alternatives)
            vy = None if y.diagnosis is None else (y.diagnosis.verdict, y.diagnosis.alternatives)
            assert vx == vy
            starting += vx is not None and vx[0] == "starting"
    assert compared >= len(polls) - 1 and starting >= 5


def test_a_job_older_than_the_longest_start_up_or_already_there_has_none() -> None:
    p = ProcessReading(pid=1, create_time=1000.0)
    assert begins([p], 1000.0 + STARTUP_MAX_SECONDS + 1) is None
    assert begins([ProcessReading(pid=1)], 1000.0) is None
    s = begins([p, ProcessReading(pid=2, create_time=990.0)], 1010.0)
    assert s is not None and s.since == 990.0
    # already there at the GPU's first poll (the recordings): no start-up, the verdict from the first windows
    header, polls = read_trace(TRACES / "h100-k-loader-workers-workers-0.jsonl.gz")
    assert all(
        r.gpus[0].diagnosis is None or r.gpus[0].diagnosis.verdict != "starting" for r in run(polls, header.node)
    )


@pytest.mark.parametrize(
    ("busy", "held_idle", "kernels", "ends"),
    [
        (0.0, 0.0, False, False),  # CPU work, no kernel
        (0.005, 0.0, True, False),  # weight initialisation: a burst of milliseconds
        (1.0, 0.0, True, True),  # a second of kernels
        (0.0, 0.8, False, True),  # held idle: nobody is starting anything
    ],
)
def test_a_start_up_ends_on_sustained_kernels_or_held_idle(
    busy: float, held_idle: float, kernels: bool, ends: bool
) -> None:
    s = StartUp(since=0.0)
    assert s.ends(10.0, 11.0, busy, held_idle, kernels) is ends


def test_kernels_that_recur_end_a_start_up_however_short_they_are() -> None:
    s = StartUp(since=0.0)
    assert not s.ends(5.0, 6.0, 0.001, 0.0, True)  # the first burst
    assert not s.ends(6.0, 7.0, 0.0, 0.0, False)
    assert s.ends(8.0, 9.0, 0.001, 0.0, True)  # kernels again 4 s after the first: a loop
    assert not StartUp(since=0.0).ends(100.0, 101.0, 0.0, 0.0, False)
    assert StartUp(since=0.0).ends(STARTUP_MAX_SECONDS, STARTUP_MAX_SECONDS + 1, 0.0, 0.0, False)


def _window(**kw: float) -> GpuWindow:
    states = {"busy": kw.pop("busy"), "starved": kw.pop("starved"), "paused": 0.0, "held_idle": 0.0, "free": 0.0}
    return GpuWindow(index=0, uuid="GPU-0", seconds=sum(states.values()), states=states, held=True, **kw)  # type: ignore[arg-type]


# util.gpu 0.3 with SM activity at 0.26 x util.gpu and one busy core: small products launched one at a time, on
# the line between launch_bound (SM activity < 0.25 x util.gpu) and the rules after it
ON_THE_LINE = {
    "util": 0.3,
    "sm": 0.3 * 0.26,
    "max_process_cpu_cores": 1.0,
    "job_cpu_cores": 1.0,
    "whole_idle_ratio": 0.6,
}


@pytest.mark.parametrize("ratio", [0.24, 0.245, 0.255, 0.26])
def test_evidence_on_the_line_names_both_verdicts_whichever_side_it_falls(ratio: float) -> None:
    w = _window(busy=18.0, starved=42.0, **{**ON_THE_LINE, "sm": 0.3 * ratio})
    d = diagnose(w)
    assert d is not None
    both = {d.verdict, *d.alternatives}
    assert {"launch_bound", "input_starved"} <= both, (d.verdict, d.alternatives)
    assert "Near the line" in d.summary


@pytest.mark.parametrize("ratio", [0.05, 0.1, 0.6, 0.9])
def test_evidence_far_from_any_line_has_no_alternative(ratio: float) -> None:
    w = _window(busy=18.0, starved=42.0, **{**ON_THE_LINE, "sm": 0.3 * ratio, "whole_idle_ratio": 0.69})
    d = diagnose(w)
    assert d is not None and d.alternatives == [] and "Near the line" not in d.summary
    assert alternatives(w, [], d.verdict) == []
    # and at the margin's edge the other side is reached: 0.25 x util.gpu moved by MARGIN
    edge = _window(busy=18.0, starved=42.0, **{**ON_THE_LINE, "sm": 0.3 * 0.25 * (1 + MARGIN * 0.9)})
    assert "launch_bound" in {*alternatives(edge, [], "input_starved"), diagnose(edge).verdict}  # type: ignore[union-attr]


def test_a_verdict_given_stays_while_the_evidence_is_within_the_margin_and_changes_past_it() -> None:
    memory = VerdictMemory()
    walk = [0.20, 0.245, 0.255, 0.26, 0.245, 0.27, 0.32, 0.26, 0.20]
    given = []
    for t, ratio in enumerate(walk):
        w = _window(busy=18.0, starved=42.0, **{**ON_THE_LINE, "sm": 0.3 * ratio})
        d = diagnose(w, (), memory.previous(w.uuid, w.processes))
        assert d is not None
        memory.remember(w.uuid, w.processes, d.verdict, float(t))
        given.append(d.verdict)
    # launch_bound below 0.25 x util.gpu; it holds across the line (0.255, 0.26) and changes only past the margin
    assert given[:5] == ["launch_bound"] * 5, given
    assert given[6] != "launch_bound" and given[7] == given[6], given
    assert given[8] == "launch_bound", given


def test_a_verdict_is_kept_only_for_the_job_it_was_given_to_and_never_from_an_older_result() -> None:
    memory = VerdictMemory()
    memory.remember("GPU-0", (1,), "launch_bound", 10.0)
    assert memory.previous("GPU-0", (1,)) == "launch_bound"
    assert memory.previous("GPU-0", (2,)) is None
    memory.remember("GPU-0", (1,), "input_starved", 9.0)  # built late from an older capture
    assert memory.previous("GPU-0", (1,)) == "launch_bound"


SESSION = TRACES.parent / "startup" / "h100-startup-session"
#: The expected steady verdict of each job of the recorded session (eval_metrics: training, then ranking metrics on
#: the host while the GPU idles - by the counters, work in the training process between steps, which input made
#: there looks like: input_starved, whose summary says it cannot tell them apart).
SESSION_JOBS = {
    "loader_workers:--workers=0": "input_starved",
    "mid_sorts:--size=44": "launch_bound",
    "mid_gemms:--size=11": "launch_bound",
    "eval_metrics:--busy=5,--pause=1": "input_starved",
    "eval_metrics:--busy=4,--pause=3": "input_starved",
    "bf16_matmul": "compute_bound",
}


def _session_jobs() -> list[tuple[str, float, float]]:
    spans = [line.split(" ", 2) for line in SESSION.with_suffix(".jobs.txt").read_text().splitlines()]
    starts = {item: float(t) for t, kind, item in spans if kind == "start"}
    return [
        (k, starts[k], float(t)) for t, kind, item in spans if kind == "end" for k in starts if item.startswith(k + ":")
    ]


def test_a_recorded_session_of_jobs_starting_up_gets_starting_then_each_jobs_verdict_live_and_replayed() -> None:
    """Six jobs, each a CUDA context and 12 s of model building on the CPU before its loop, one after another on a
    lent H100 under a live daemon (tools/device-startup-live.sh); the session's recording replayed here, the live
    daemon's answers saved beside it."""
    import json

    header, polls = read_trace(SESSION.with_suffix(".jsonl.gz"))
    results = run(polls, header.node)
    live = json.loads(SESSION.with_suffix(".live.json").read_text())["answers"]
    jobs = _session_jobs()
    assert [k for k, _, _ in jobs] == list(SESSION_JOBS)
    for key, start, end in jobs:
        mine = [
            (p.timestamp, r.gpus[0].diagnosis)
            for p, r in zip(polls, results, strict=True)
            if start <= p.timestamp < end
        ]
        # the process imports torch first: the GPU is free until its CUDA context exists
        verdicts = [d.verdict for _, d in mine if d is not None]
        verdicts = verdicts[next(i for i, v in enumerate(verdicts) if v != "free") :]
        first = next(i for i, v in enumerate(verdicts) if v != "starting")
        assert verdicts[0] == "starting" and first >= 5, (key, verdicts[:12])  # 12 s of start-up, less history
        assert "starting" not in verdicts[first:], (key, verdicts)
        assert verdicts[-1] == SESSION_JOBS[key], (key, verdicts[-8:])
        said = [a for a in live if start <= a["timestamp"] < end - 1 and a["verdict"] not in (None, "free")]
        assert said[0]["verdict"] == "starting" and said[-1]["verdict"] == verdicts[-1], (key, said[-1])
    # the start-ups are accounted as such: 6 jobs x 12 s of model building, plus each context's creation and the
    # seconds until the loop's kernels recur
    idle = results[-1].gpus[0].idle_seconds_total
    assert 6 * 12 <= idle["startup"] <= 6 * 20, idle
    # the code evidence the live daemon took names the workload's own functions
    evidence = {a["code_evidence"]["summary"] for a in live if a["code_evidence"]}
    assert any("_Heavy.__getitem__" in e for e in evidence) and any("mid_sorts" in e for e in evidence), evidence


def test_a_straggler_and_its_waiter_are_named_by_rank() -> None:
    waiter = _window(busy=58.0, starved=2.0, util=0.97, sm=0.25, max_process_cpu_cores=1.0, job_cpu_cores=1.0)
    waiter = GpuWindow(**{**waiter.__dict__, "rank": 0})
    slow = GpuWindow(**{**waiter.__dict__, "index": 1, "uuid": "GPU-1", "util": 0.15, "sm": 0.14, "rank": 1})
    d = diagnose(waiter, [slow])
    assert d is not None and d.verdict == "waiting_on_peers" and "GPU 1 (rank 1) of the same job" in d.summary
    s = diagnose(slow, [waiter])
    assert s is not None and "Straggler of its job (rank 1): GPU 0 (rank 0) wait(s) on it." in s.summary
