"""The actions of the reclaim ladder: a step's command or webhook, filled in with the job's names and run where it
can never hold the ladder up.

- **Templates.** A command is an argument list run without a shell; each argument is a template whose placeholders
  (gpuwarden.reclaim.policy.PLACEHOLDERS) take the decision's values. Values come from the machine (job ids, pod
  names) and are hostile: one with a control character, or one that would begin an argument with ``-`` (read as an
  option by scancel or kubectl), refuses the action ("refused"), as does a placeholder the job has no value for (a
  job without a Slurm id asked for ``{slurm_job_id}``, which only a job keyed by its Slurm number from its cgroup
  has: never a number from a process's environment). A webhook gets the decision as JSON.
- **Bounds.** At most ``max_concurrent`` actions run at once, in worker threads, and at most MAX_QUEUED wait; past
  that an action is dropped ("dropped"). A command that outlives its step's ``timeout_seconds`` is killed with its
  process group ("timed_out"); its output is kept to OUTPUT_BYTES and the rest read and dropped (a command that
  floods its output costs no memory); a webhook's answer is read to OUTPUT_BYTES. A failure is "failed", with the
  exit status or error.
- **Dry run.** Nothing runs: the outcome is "dry_run" (the policy's default).

Each outcome goes to ``on_outcome(decision, outcome, detail)``: the controller logs it and counts it.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuwarden.reclaim.ladder import Decision
from gpuwarden.reclaim.policy import Step

#: Actions waiting for a worker at most; past this a new one is dropped.
MAX_QUEUED = 64
#: Bytes of an action's output (or a webhook's answer) kept for the log.
OUTPUT_BYTES = 4096
#: The longest value a placeholder may take.
MAX_VALUE_CHARS = 256

Outcome = Callable[[Decision, str, str], None]


class Refused(Exception):
    """A template cannot be filled in safely; the message says which placeholder and why."""


def values(decision: Decision, cluster_labels: tuple[str, ...] = ("cluster",)) -> dict[str, str]:
    """The placeholders' values for ``decision`` (gpuwarden.reclaim.policy.PLACEHOLDERS); '' where unknown."""
    f, key = decision.facts, decision.key
    return {
        "job_id": key.job_id,
        "job_kind": f.kind,
        "cluster": "/".join(key.cluster),
        "instance": key.instance or "",
        "nodes": ",".join(sorted({inst for inst, _ in f.gpus})),
        "gpus": str(len(f.gpus)),
        # only the number Slurm vouches for: the job's key from its cgroup (job_<number>), ASCII digits. Not the
        # slurm_job_id a daemon read from the job's environment (a SLUID-keyed job's): a process sets its own
        # SLURM_JOB_ID, and would aim the action at another user's job
        "slurm_job_id": key.job_id if f.kind == "slurm" and re.fullmatch(r"[0-9]+", key.job_id) else "",
        "namespace": f.names.get("namespace", ""),
        "pod": f.names.get("pod", ""),
        "step": decision.step,
        "idle_seconds": str(int(decision.idle_seconds)),
        "idle_minutes": str(int(decision.idle_seconds // 60)),
        "reasons": ",".join(sorted(f.reasons)),
    }


def fill(template: str, given: dict[str, str]) -> str:
    """``template`` with its placeholders filled from ``given``. Raises Refused for a value that is empty, too long,
    holds a control character, or would begin the argument with ``-``."""
    import string

    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        value = given.get(name, "")
        if not value:
            raise Refused(f"{{{name}}} is not known for this job")
        if len(value) > MAX_VALUE_CHARS or not value.isprintable():
            raise Refused(f"{{{name}}} holds control characters or is too long")
        out.append(value)
    text = "".join(out)
    if text.startswith("-") and not template.startswith("-"):
        raise Refused(f"the argument {template!r} would begin with '-'")
    return text


class ActionRunner:
    """Runs the steps' actions for decisions (see the module doc); ``dry_run``: runs none."""

    def __init__(
        self,
        dry_run: bool,
        on_outcome: Outcome,
        max_concurrent: int = 4,
        cluster_labels: tuple[str, ...] = ("cluster",),
    ) -> None:
        self.dry_run = dry_run
        self.on_outcome = on_outcome
        self.cluster_labels = cluster_labels
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="gpuwarden-reclaim-action")
        self._waiting = 0
        self._lock = threading.Lock()

    def submit(self, decision: Decision, step: Step) -> None:
        """Run ``step``'s action for ``decision`` in a worker (or say why not); returns at once."""
        if self.dry_run:
            self.on_outcome(decision, "dry_run", "dry run: nothing was run")
            return
        if step.command is None and step.webhook is None:
            self.on_outcome(decision, "logged", "the step has no action")
            return
        given = values(decision, self.cluster_labels)
        try:
            argv = [fill(arg, given) for arg in step.command] if step.command is not None else None
        except Refused as exc:
            self.on_outcome(decision, "refused", str(exc))
            return
        with self._lock:
            if self._waiting >= MAX_QUEUED:
                self.on_outcome(decision, "dropped", f"{MAX_QUEUED} actions already wait")
                return
            self._waiting += 1
        self._pool.submit(self._run, decision, step, argv, given)

    def _run(self, decision: Decision, step: Step, argv: list[str] | None, given: dict[str, str]) -> None:
        with self._lock:
            self._waiting -= 1
        try:
            if argv is not None:
                outcome, detail = run_command(argv, step.timeout_seconds)
            else:
                assert step.webhook is not None
                outcome, detail = post_webhook(step.webhook.url, step.webhook.headers, document(decision, given),
                                               step.timeout_seconds)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - an action's failure is its outcome, never the controller's
            outcome, detail = "failed", f"{type(exc).__name__}: {exc}"
        self.on_outcome(decision, outcome, detail)

    def close(self, wait: bool = True) -> None:
        """Stop taking actions; with ``wait``, until the running ones end (each within its timeout)."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)


def document(decision: Decision, given: dict[str, str]) -> dict[str, Any]:
    """The JSON document a webhook gets: the placeholders' values, the time, the evidence and the GPUs."""
    return {
        **given,
        "time": decision.time,
        "evidence": decision.evidence,
        "gpu_list": [{"instance": inst, "gpu": gpu} for inst, gpu in sorted(decision.facts.gpus)],
    }


#: After a command ends, how long its output is still read (a child that left the group may hold the pipe open).
OUTPUT_GRACE_SECONDS = 1.0


def run_command(argv: list[str], timeout: float) -> tuple[str, str]:
    """Run ``argv`` (no shell, no input) in its own process group: ("ran", output) on exit status 0, ("failed",
    status and output) otherwise or when it cannot start, ("timed_out", output) when it outlives ``timeout`` s. When
    it ends or is killed, what is left of its group (children it started in the background) is killed too, and its
    output is read for at most OUTPUT_GRACE_SECONDS more: no child and no reading thread outlives the action by
    more (a child that left the group with setsid is its own; its pipe is closed on it). The output kept is its
    first OUTPUT_BYTES; the rest is read and dropped."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)  # fmt: skip
    except OSError as exc:
        return "failed", f"cannot run {argv[0]}: {exc.strerror or exc}"
    kept = bytearray()
    ended = threading.Event()
    assert proc.stdout is not None
    fd = proc.stdout.fileno()

    def read() -> None:
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready:
                    if ended.is_set():
                        return
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return
                if len(kept) < OUTPUT_BYTES:
                    kept.extend(chunk[: OUTPUT_BYTES - len(kept)])
        finally:
            proc.stdout.close()  # type: ignore[union-attr]

    reader = threading.Thread(target=read, name="gpuwarden-reclaim-output", daemon=True)
    reader.start()
    try:
        status: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        status = None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the command (timed out) or what it left behind
    proc.wait()
    reader.join(OUTPUT_GRACE_SECONDS)
    ended.set()  # a pipe still held (by a child outside the group): stop reading it
    reader.join()
    if status is None:
        return "timed_out", f"killed after {timeout:g} s; output: {_text(kept)}"
    if status != 0:
        return "failed", f"exit status {status}; output: {_text(kept)}"
    return "ran", _text(kept)


def post_webhook(url: str, headers: dict[str, str], doc: dict[str, Any], timeout: float) -> tuple[str, str]:
    """POST ``doc`` as JSON to ``url``: ("ran", status) on a 2xx answer, ("failed", why) otherwise, ("timed_out")
    when the exchange or one of its reads outlives ``timeout`` s: it runs in a thread waited on until then (httpx's
    timeouts bound each read, not the whole exchange: a server that drips its answer would outlast them); then its
    connection is closed under it, so the thread ends too, whatever the server does. The answer is read to
    OUTPUT_BYTES."""
    import httpx

    answer: list[tuple[str, str]] = []
    client = httpx.Client(timeout=timeout)

    def exchange() -> None:
        try:
            with client.stream("POST", url, json=doc, headers=headers) as r:
                body = bytearray()
                for chunk in r.iter_bytes():
                    body.extend(chunk[: max(0, OUTPUT_BYTES - len(body))])
                    if len(body) >= OUTPUT_BYTES:
                        break
                ok = 200 <= r.status_code < 300
                answer.append(("ran", f"HTTP {r.status_code}") if ok else ("failed", f"HTTP {r.status_code}: "
                                                                                      f"{_text(body)}"))  # fmt: skip
        except httpx.TimeoutException:  # one of httpx's own timeouts ran out before the whole exchange's
            answer.append(("timed_out", f"no answer within {timeout:g} s"))
        except Exception as exc:  # noqa: BLE001 - an HTTP error, or the connection closed under it at the deadline
            answer.append(("failed", f"{type(exc).__name__}: {exc}"))
        finally:
            client.close()

    worker = threading.Thread(target=exchange, name="gpuwarden-reclaim-webhook", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        client.close()  # the server still answering: its connection closed under the worker, which then ends
        return "timed_out", f"no answer within {timeout:g} s"
    return answer[0]


def _text(data: bytes | bytearray) -> str:
    """Output as one line of text for a log field (the log's format escapes what it must)."""
    return bytes(data).decode("utf-8", "replace").strip().replace("\n", " | ")[:OUTPUT_BYTES]
