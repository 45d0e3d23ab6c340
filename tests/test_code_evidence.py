"""Code-level evidence: py-spy's samples of a job's process, reduced to the job's own functions (real py-spy against
a real Python process with a known slow function; its errors as one line)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from gpuwarden.config import ConfigError, load_config
from gpuwarden.insight.code_evidence import (
    CodeEvidence,
    CodeEvidenceSampler,
    Frame,
    Target,
    busiest_process,
    run_py_spy,
    sampled_processes,
    top_frames,
)

_TRAIN = "<module> (/home/u/train.py:120);train (/home/u/train.py:101)"
RAW = "\n".join(
    [
        f"{_TRAIN};decode_batch (/home/u/train.py:88);resize (/usr/lib/python3/dist-packages/PIL/Image.py:2200) 71",
        "<module> (/home/u/train.py:120);train (/home/u/train.py:104);step (/home/u/train.py:60);"
        "backward (/opt/v/lib/python3.11/site-packages/torch/_tensor.py:521) 20",
        f"{_TRAIN};decode_batch (/home/u/train.py:90) 4",
        "select (/usr/lib/python3.11/selectors.py:415) 5",
        "this line is not a stack",
    ]
)


def test_samples_count_against_the_deepest_frame_of_the_jobs_own_code() -> None:
    total, frames = top_frames(RAW)
    assert total == 100
    assert frames[0] == Frame(function="decode_batch", file="/home/u/train.py", line=88, share=0.75)
    assert frames[1] == Frame(function="step", file="/home/u/train.py", line=60, share=0.2)
    # all library code: the leaf stands
    assert frames[2].function == "select" and frames[2].share == 0.05
    e = CodeEvidence(pid=7, verdict="input_starved", taken_at=0.0, seconds=5.0, samples=total, frames=frames)
    assert "75% in decode_batch (train.py:88)" in e.sentence()


def test_hostile_frames_are_cut_and_shown_as_text() -> None:
    evil = "\x1b]0;pwned\x07" + "x" * 5000
    total, frames = top_frames(f"{evil} (/tmp/[bold]evil.py:1) 3\n")
    assert total == 3 and len(frames[0].function) <= 200
    e = CodeEvidence(pid=1, verdict="launch_bound", taken_at=0.0, seconds=1.0, samples=3, frames=frames)
    from gpuwarden.terminal import plain

    out = io.StringIO()
    Console(file=out, width=300, force_terminal=True).print(plain(e.sentence()))
    assert "\x1b]0;" not in out.getvalue() and "\x07" not in out.getvalue() and "[bold]" in out.getvalue()


def test_with_subprocesses_each_stack_counts_for_the_process_it_was_taken_in() -> None:
    """py-spy --subprocesses roots each stack at a ``process PID:"cmdline"`` frame for every process from the sampled
    one down: the deepest names the process; those frames are never code (a hostile command line included)."""
    root = 'process 7:"python train.py"'
    raw = "\n".join([
        f"{root};process 9:\"python train.py (x.py:1)\";<module> (/w/train.py:5);decode (/w/train.py:30) 80",
        f"{root};<module> (/w/train.py:5);step (/w/train.py:60) 20",
    ])  # fmt: skip
    total, frames = top_frames(raw)
    assert total == 100 and [f.function for f in frames] == ["decode", "step"]
    assert sampled_processes(raw) == {9: 80, 7: 20} and sampled_processes(RAW) == {}
    e = CodeEvidence(pid=7, verdict="input_starved", taken_at=0.0, seconds=5.0, samples=total, frames=frames,
                     busiest_pid=9, busiest_share=0.8)  # fmt: skip
    assert "(80% of them in its child process PID 9): 80% in decode (train.py:30)" in e.sentence()


SLOW = textwrap.dedent(
    """
    import sys, time

    def decode_batch(n):
        s = 0
        for i in range(n):
            s += i * i % 7
        return s

    def train():
        print("ready", flush=True)
        end = time.time() + 60
        while time.time() < end:
            decode_batch(200000)
            time.sleep(0.001)

    train()
    """
)


@pytest.fixture
def slow_job(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    script = tmp_path / "train.py"
    script.write_text(SLOW)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"  # wait for its loop, not a sleep
    yield p
    p.kill()
    p.wait()


@pytest.mark.e2e
def test_py_spy_names_the_function_a_job_spends_its_time_in(slow_job: subprocess.Popen[str]) -> None:
    sampler = CodeEvidenceSampler(lambda: [Target("GPU-0", "input_starved", slow_job.pid)], seconds=2.0, rate=100)
    assert sampler.check_once() == ["GPU-0"]
    from gpuwarden.model import GpuReading, GpuStatic, NodeStatic, PollResult, ProcessReading

    static = NodeStatic(hostname="h", driver_version="d", gpus=[GpuStatic(index=0, uuid="GPU-0", name="H100")])

    def poll(pids: list[int]) -> PollResult:
        procs = [ProcessReading(pid=p) for p in pids]
        return PollResult(
            timestamp=0.0,
            duration_seconds=0.0,
            gpus=[GpuReading(index=0, uuid="GPU-0", timestamp=0.0, processes=procs)],
        )

    e = sampler.analyzer(poll([slow_job.pid, 1]), static)["GPU-0"]
    if e.error is not None and "may not read" in e.error:
        pytest.skip(f"this machine does not let py-spy read another process: {e.error}")  # not root, ptrace_scope
    assert e.error is None, e.error
    assert e.samples >= 50 and e.frames[0].function == "decode_batch" and e.frames[0].share >= 0.5, e
    assert e.frames[0].file.endswith("train.py") and "decode_batch (train.py:" in e.summary
    # at most one run per GPU per every_seconds
    assert sampler.check_once() == []
    # the job leaves the GPU: its evidence goes with it
    assert sampler.analyzer(poll([1]), static) == {}


WORKERS = textwrap.dedent(
    """
    import multiprocessing as mp, time

    def decode_batch(n):
        s = 0
        for i in range(n):
            s += i * i % 7
        return s

    def worker():
        while True:
            decode_batch(200000)

    def train():
        p = mp.Process(target=worker, daemon=True)
        p.start()
        print(p.pid, flush=True)
        while True:
            time.sleep(0.05)  # waits on its worker, as a training loop waits on its DataLoader

    if __name__ == "__main__":
        train()
    """
)


@pytest.mark.e2e
def test_the_evidence_comes_from_the_worker_process_where_the_cpu_is(tmp_path: Path) -> None:
    """A job whose main process waits on a worker process that does the work (a DataLoader's pattern): the sampled
    main process and its children; the function is the worker's, and the sentence names the worker's PID."""
    script = tmp_path / "train.py"
    script.write_text(WORKERS)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = 0
    try:
        assert p.stdout is not None
        worker = int(p.stdout.readline())
        sampler = CodeEvidenceSampler(lambda: [Target("GPU-0", "input_starved", p.pid)], seconds=2.0, rate=100)
        assert sampler.check_once() == ["GPU-0"]
        e = sampler._evidence["GPU-0"]
        if e.error is not None and "may not read" in e.error:
            pytest.skip(f"this machine does not let py-spy read another process: {e.error}")
        assert e.error is None, e.error
        assert e.frames[0].function == "decode_batch" and e.frames[0].share >= 0.5, e
        assert e.busiest_pid == worker and (e.busiest_share or 0) >= 0.5, e
        assert f"in its child process PID {worker}" in e.summary
    finally:
        p.kill()
        p.wait()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)  # the parent killed, its worker is not told


@pytest.mark.e2e
def test_a_process_that_is_not_python_is_one_line() -> None:
    p = subprocess.Popen(["sleep", "30"])
    try:
        raw, error = run_py_spy("py-spy", p.pid, 1.0, 50)
    finally:
        p.kill()
        p.wait()
    assert raw is None and error is not None and "\n" not in error and str(p.pid) in error


def test_a_missing_py_spy_is_one_line() -> None:
    raw, error = run_py_spy("/nonexistent/py-spy", 1, 1.0, 50)
    assert raw is None and error == "py-spy is not installed ('/nonexistent/py-spy' not found; pip install py-spy)"


def test_only_verdicts_the_jobs_code_causes_are_sampled() -> None:
    calls: list[int] = []

    def fake(py_spy: str, pid: int, seconds: float, rate: int) -> tuple[str | None, str | None]:
        calls.append(pid)
        return None, "py-spy may not read PID 5 (run gpuwarden as root or with CAP_SYS_PTRACE)"

    targets = [Target("GPU-a", "compute_bound", 4), Target("GPU-b", "launch_bound", 5)]
    sampler = CodeEvidenceSampler(lambda: targets, sampler=fake)
    assert sampler.check_once(now=1000.0) == ["GPU-b"] and calls == [5]
    assert sampler.check_once(now=1000.0 + 599) == []
    assert sampler.check_once(now=1000.0 + 601) == ["GPU-b"]
    targets[1] = Target("GPU-b", "launch_bound", 6)  # another job on the GPU: sampled at once
    assert sampler.check_once(now=1000.0 + 602) == ["GPU-b"] and calls == [5, 5, 6]


def test_the_busiest_process_is_the_one_sampled() -> None:
    assert busiest_process([(10, 0.2), (11, 1.0), (12, None)]) == 11
    assert busiest_process([(12, None), (10, None)]) == 10
    assert busiest_process([]) is None


def test_code_evidence_on_a_replay_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("insight:\n  code_evidence:\n    enabled: true\n")
    with pytest.raises(ConfigError, match="cannot apply to a replay or the demo"):
        load_config(cfg, {"demo": True})
