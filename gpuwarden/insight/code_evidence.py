"""Code-level evidence (opt-in): which Python function a starved or launch-bound GPU's job spends its time in.

When a GPU's verdict is one that the job's own code causes (``input_starved``, ``launch_bound``,
``host_compute_bound``), ``CodeEvidenceSampler`` samples the Python stacks of the job's busiest process on that GPU
and of its child processes (DataLoader workers, a multiprocessing pool: where a job's input is prepared, and where
its CPU is while the GPU waits) for a few seconds with py-spy (``py-spy record --nonblocking --subprocesses``: no
process is paused; reading another process's memory needs root or CAP_SYS_PTRACE) and keeps the functions most
samples were in, and the process most of them were taken in: "71% of samples in decode_batch (train.py:88)", "in
its child PID 9: 80%". A sample counts against the deepest frame of the job's own code (not the standard
library, not site-packages): the line of the training script that waits, not the inside of NumPy. Samples are of
the process's active threads over the sampling time, while the GPU had that verdict; py-spy does not say which of
them fell in the GPU's idle moments.

Bounded: off unless configured (``insight.code_evidence.enabled``), at most one sampling run at a time and one per
GPU per ``every_seconds``; py-spy runs in its own process (its CPU is its own, a few seconds in ten minutes). What it
reads is hostile input: function and file names are cut and shown as text only (escaped where printed). A process
that is not Python, a py-spy that is missing or not permitted, gives one line in ``error``, never a traceback.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.insight.vocabulary.result import snapshot_insight
from gpuwarden.model import NodeStatic, PollResult
from gpuwarden.snapshot import SnapshotHolder

log = logging.getLogger(__name__)

#: Verdicts the job's own code causes: the ones worth a look at its stacks.
TRIGGERS = frozenset({"input_starved", "launch_bound", "host_compute_bound"})
#: Frames kept per report, and the longest function or file name kept (hostile input, cut).
TOP_FRAMES = 5
MAX_NAME = 200
#: How often the sampler looks at the verdicts (seconds).
CHECK_SECONDS = 10.0
#: Paths of code that is not the job's own: the standard library and installed packages.
_LIBRARY = re.compile(r"/(site-packages|dist-packages)/|/lib/python3[.\d]*/|^<frozen |^<string>$")
#: One py-spy raw frame: ``function (file:line)``.
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
#: The frame py-spy puts at the root of each stack for each process from the one sampled down to the one the stack
#: is of, with ``--subprocesses``: ``process PID:"command line"`` (the command line is hostile: never parsed).
_PROCESS = re.compile(r"^process (?P<pid>\d+):")


class Frame(BaseModel):
    """A function of the job's code and the share of samples in it (as the deepest frame of the job's own code)."""

    model_config = ConfigDict(frozen=True)

    function: str
    file: str
    line: int = Field(description="the line most of its samples were at")
    share: float = Field(description="share of the samples (0-1)")


class CodeEvidence(BaseModel):
    """The stacks of one GPU's job, sampled while the GPU had ``verdict``: the process, when and how long, how many
    samples (of it and its child processes), the functions most of them were in, and the process most were taken in
    (``busiest_pid``, its share ``busiest_share``); ``error`` (one line) when it could not be sampled."""

    model_config = ConfigDict(frozen=True)

    pid: int
    verdict: str
    taken_at: float = Field(description="Unix seconds the sampling ended")
    seconds: float
    samples: int = 0
    frames: list[Frame] = Field(default_factory=list)
    busiest_pid: int | None = Field(default=None, description="the process most samples were taken in: ``pid`` or "
                                    "one of its children (a DataLoader worker)")  # fmt: skip
    busiest_share: float | None = Field(default=None, description="its share of the samples (0-1)")
    error: str | None = None
    summary: str = Field(default="", description="the evidence in one sentence (``sentence``)")

    def sentence(self) -> str:
        """Return the evidence in one sentence: "71% of samples in decode_batch (train.py:88), ..." (and the child
        process most samples were taken in, where it was not ``pid``) or the error."""
        if self.error is not None:
            return f"No code evidence for PID {self.pid}: {self.error}"
        if not self.frames:
            return f"PID {self.pid}: no samples of active Python code in {self.seconds:g} s."
        top = ", ".join(f"{f.share:.0%} in {f.function} ({Path(f.file).name}:{f.line})" for f in self.frames[:3])
        where = ""
        if self.busiest_pid is not None and self.busiest_pid != self.pid and self.busiest_share is not None:
            where = f" ({self.busiest_share:.0%} of them in its child process PID {self.busiest_pid})"
        return f"PID {self.pid} and its children, {self.samples} samples over {self.seconds:g} s while " \
               f"{self.verdict}{where}: {top}."  # fmt: skip


def _cut(text: str) -> str:
    return text if len(text) <= MAX_NAME else text[: MAX_NAME - 1] + "…"


def top_frames(raw: str, limit: int = TOP_FRAMES) -> tuple[int, list[Frame]]:
    """Return the number of samples in py-spy's raw (collapsed) output ``raw`` - one line per distinct stack, frames
    root first separated by ``;``, then a space and a count - and the ``limit`` functions most samples were in (the
    deepest frame of the job's own code, or the leaf when every frame is library code). Malformed lines are skipped."""
    total = 0
    by_function: Counter[tuple[str, str]] = Counter()
    lines: dict[tuple[str, str], Counter[int]] = {}
    for row in raw.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [m for m in (_FRAME.match(f) for f in stack.split(";") if not _PROCESS.match(f)) if m is not None]
        if not frames:
            continue
        total += n
        own = [m for m in frames if not _LIBRARY.search(m["file"])]
        m = (own or frames)[-1]
        key = (_cut(m["function"]), _cut(m["file"]))
        by_function[key] += n
        lines.setdefault(key, Counter())[int(m["line"])] += n
    frames_out = [
        Frame(function=f, file=path, line=lines[(f, path)].most_common(1)[0][0], share=round(n / total, 4))
        for (f, path), n in by_function.most_common(limit)
    ]
    return total, frames_out


def sampled_processes(raw: str) -> Counter[int]:
    """Samples per process in py-spy's raw output ``raw`` recorded with ``--subprocesses``: each stack counts for
    the deepest ``process PID:`` frame at its root (the process it was taken in). Empty without such frames."""
    out: Counter[int] = Counter()
    for row in raw.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        pids = [m["pid"] for m in (_PROCESS.match(f) for f in stack.split(";")) if m is not None]
        if pids:
            out[int(pids[-1])] += int(count)
    return out


def _error_line(stderr: str, pid: int) -> str:
    """One line for a failed py-spy run, from its stderr (hostile: cut to one line)."""
    text = " ".join(stderr.split())
    low = text.lower()
    if "permission" in low or "operation not permitted" in low:
        return f"py-spy may not read PID {pid} (run gpuwarden as root or with CAP_SYS_PTRACE)"
    if "python" in low and ("failed to find" in low or "not a python" in low or "version" in low):
        return f"PID {pid} is not a Python process py-spy can read"
    if "no such process" in low or "failed to open process" in low or "executable name" in low:
        return f"PID {pid} exited"
    return _cut(f"py-spy failed: {text}" if text else "py-spy failed")


def run_py_spy(py_spy: str, pid: int, seconds: float, rate: int) -> tuple[str | None, str | None]:
    """Run ``py-spy record`` on ``pid`` and its child processes for ``seconds`` at ``rate`` samples a second without
    pausing them; return its raw collapsed stacks, or None and one line saying why not (py-spy missing, not
    permitted, not Python, exited). Raises nothing."""
    exe = shutil.which(py_spy)
    if exe is None:
        return None, f"py-spy is not installed ({py_spy!r} not found; pip install py-spy)"
    with tempfile.TemporaryDirectory(prefix="gpuwarden-pyspy-") as tmp:
        out = Path(tmp) / "stacks.txt"
        cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(rate)]
        cmd += ["--format", "raw", "--nonblocking", "--full-filenames", "--subprocesses", "--output", str(out)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, _cut(f"py-spy could not run: {e}")
        if done.returncode != 0 or not out.exists():
            return None, _error_line(done.stderr, pid)
        return out.read_text(errors="replace"), None


Sampler = Callable[[str, int, float, int], tuple[str | None, str | None]]


@dataclass(frozen=True)
class Target:
    """A GPU whose verdict asks for code evidence: its UUID, the verdict, and its job's busiest process."""

    uuid: str
    verdict: str
    pid: int


class CodeEvidenceSampler:
    """Samples the stacks of starved or launch-bound GPUs' jobs in its own thread (``start``/``stop``); its
    ``analyzer`` hands the evidence so far to every poll's snapshot (``analyses["code_evidence"]``: UUID ->
    CodeEvidence). ``targets`` returns, at each check, the GPUs to consider (from the latest diagnosis)."""

    def __init__(
        self,
        targets: Callable[[], Sequence[Target]],
        seconds: float = 5.0,
        rate: int = 50,
        every_seconds: float = 600.0,
        py_spy: str = "py-spy",
        sampler: Sampler = run_py_spy,
    ) -> None:
        self._targets = targets
        self.seconds, self.rate, self.every = seconds, rate, every_seconds
        self.py_spy = py_spy
        self._sample = sampler
        self._lock = threading.Lock()
        self._evidence: dict[str, CodeEvidence] = {}
        self._last: dict[tuple[str, int], float] = {}  # (GPU UUID, PID) -> when it was last sampled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def analyzer(self, poll: PollResult, static: NodeStatic) -> Mapping[str, CodeEvidence]:
        """The poller's analyzer: the evidence of every GPU whose sampled process still holds it at ``poll`` (a copy):
        a job that left takes its evidence with it."""
        holding = {g.uuid: {p.pid for p in g.processes or ()} for g in poll.gpus}
        with self._lock:
            for uuid in [u for u, e in self._evidence.items() if e.pid not in holding.get(u, ())]:
                del self._evidence[uuid]
            return dict(self._evidence)

    def check_once(self, now: float | None = None) -> list[str]:
        """Sample every target whose process was not sampled on its GPU within ``every_seconds`` (a new job on a GPU
        is sampled at once), one after another; return their UUIDs. ``now``: the time to judge by (Unix s; default
        the clock at each target, as sampling runs take seconds)."""
        done = []
        start = time.time() if now is None else now
        self._last = {k: t for k, t in self._last.items() if start - t < self.every}  # bounded: recent runs only
        for t in self._targets():
            at = time.time() if now is None else now
            if t.verdict not in TRIGGERS or at - self._last.get((t.uuid, t.pid), -1e18) < self.every:
                continue
            self._last[(t.uuid, t.pid)] = at
            raw, error = self._sample(self.py_spy, t.pid, self.seconds, self.rate)
            samples, frames = top_frames(raw) if raw is not None else (0, [])
            by_process = sampled_processes(raw) if raw is not None else Counter()
            busiest = min(by_process.items(), key=lambda kv: (-kv[1], kv[0])) if by_process else None
            evidence = CodeEvidence(
                pid=t.pid,
                verdict=t.verdict,
                taken_at=time.time(),
                seconds=self.seconds,
                samples=samples,
                frames=frames,
                busiest_pid=busiest[0] if busiest else None,
                busiest_share=round(busiest[1] / sum(by_process.values()), 4) if busiest else None,
                error=error,
            )
            evidence = evidence.model_copy(update={"summary": evidence.sentence()})
            if error is not None:
                log.warning("code evidence for GPU %s: %s", t.uuid, error.encode("unicode_escape").decode())
            with self._lock:
                self._evidence[t.uuid] = evidence
            done.append(t.uuid)
            if self._stop.is_set():
                break
        return done

    def _run(self) -> None:
        while not self._stop.wait(CHECK_SECONDS):
            try:
                self.check_once()
            except Exception:  # a sampler failure must never stop the daemon
                log.exception("code evidence check failed")

    def start(self) -> None:
        """Start the sampling thread (a daemon thread)."""
        self._thread = threading.Thread(target=self._run, name="code-evidence", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampling thread (a sampling run in progress finishes)."""
        self._stop.set()


def busiest_process(pids_cpu: Sequence[tuple[int, float | None]]) -> int | None:
    """Return the PID of the process with the most CPU (cores; None counts as 0; the lower PID on a tie), None for
    no process: the job's process that launches the kernels or prepares input in its own loop."""
    if not pids_cpu:
        return None
    return min(pids_cpu, key=lambda pc: (-(pc[1] or 0.0), pc[0]))[0]


def targets_from(holder: SnapshotHolder) -> Callable[[], list[Target]]:
    """Return the ``targets`` of a CodeEvidenceSampler reading the latest diagnosis of ``holder``'s snapshot: each
    GPU whose verdict is in TRIGGERS, with the busiest process of its job on it (never gpuwarden itself)."""

    def targets() -> list[Target]:
        snap = holder.snapshot
        res = snapshot_insight(snap) if snap is not None else None
        if res is None:
            return []
        out = []
        for g in res.gpus:
            d = g.diagnosis
            if d is None or d.verdict not in TRIGGERS:
                continue
            procs = [(p.pid, p.cpu_cores) for p in res.processes if p.uuid == g.uuid and p.job == d.job]
            pid = busiest_process([pc for pc in procs if pc[0] != os.getpid()])
            if pid is not None:
                out.append(Target(g.uuid, d.verdict, pid))
        return out

    return targets
