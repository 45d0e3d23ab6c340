"""The reclaim policy: a YAML file that says which idle jobs climb the ladder, its steps, and what each step does.

Defaults are safe: ``dry_run`` is true (every decision is logged and exported, no action runs), and a step without
an action only logs. An action is a command (an argument list run without a shell, each argument a template of the
job's names: ``{job_id}``, ``{slurm_job_id}``, ``{namespace}``, ``{pod}``, ...) or a webhook (a JSON document
POSTed to a URL). A file that cannot be read or does not validate is one line (``PolicyError``), and ``gpuwarden
reclaim`` exits 2 on it.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuwarden.cluster.durations import seconds
from gpuwarden.config import ConfigError, read_yaml
from gpuwarden.insight.reasons import VERDICT_ORDER
from gpuwarden.insight.vocabulary.states import IDLE_CAUSES


class PolicyError(Exception):
    """The policy file is unreadable or invalid; ``str()`` is one line naming the file and the key."""


#: What an action's templates may name (gpuwarden.reclaim.actions fills them in for each decision).
PLACEHOLDERS = frozenset(
    {
        "job_id",
        "job_kind",
        "cluster",
        "instance",
        "nodes",
        "gpus",
        "slurm_job_id",
        "namespace",
        "pod",
        "step",
        "idle_seconds",
        "idle_minutes",
        "reasons",
    }
)

#: Idle causes that cannot mean a job left its GPUs idle: nobody held the GPU, or it could not be read.
_NOT_RECLAIMABLE = frozenset({"free", "lost", "unknown"})
#: Labels of the jobs' series (gpu_process_job_info, gpu_job_info) that the GPU counters do not carry: a ``selector``
#: naming one would select no GPU time at all.
JOB_LABELS = frozenset({"job_id", "job_kind", "job_scope", "user", "pid", "process_name", "namespace", "pod",
                        "container", "container_id", "slurm_job_id"})  # fmt: skip


def _fields(template: str) -> set[str]:
    """The placeholders a template names; raises ValueError for a malformed one or a name not in PLACEHOLDERS."""
    try:
        names = {name for _, name, spec, conv in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"malformed template {template!r}: {exc}") from None
    unknown = names - PLACEHOLDERS
    if unknown:
        raise ValueError(f"unknown placeholder {{{sorted(unknown)[0]}}} (known: {', '.join(sorted(PLACEHOLDERS))})")
    return names


class Webhook(BaseModel):
    """A JSON document (the decision) POSTed to ``url``, with ``headers``."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https?://[^\s]+$", description="http(s) URL the decision is POSTed to")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers sent with it")

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name) or not text.isprintable():
                raise ValueError(f"not an HTTP header: {name!r}")
        return value


class Step(BaseModel):
    """One rung: reached once the job has been reclaimably idle for ``after`` (and the rung before was taken at least
    the difference of their ``after`` ago); then its action runs once (``command`` or ``webhook``; neither: only
    logged), within ``timeout_seconds``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$", description="the step's name (a label value)")
    after: str = Field(description="how long the job must have been idle, as PromQL writes durations (30m, 2h)")
    command: list[str] | None = Field(
        default=None, min_length=1, description="argument list run without a shell; each argument a template"
    )
    webhook: Webhook | None = None
    timeout_seconds: float = Field(default=30.0, gt=0, le=600, description="an action still running is killed")

    @field_validator("after")
    @classmethod
    def _after(cls, value: str) -> str:
        seconds(value)  # ValueError: not a duration
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        for arg in value or ():
            _fields(arg)
        return value

    @model_validator(mode="after")
    def _one_action(self) -> Step:
        if self.command is not None and self.webhook is not None:
            raise ValueError("a step has a command or a webhook, not both")
        return self

    @property
    def after_seconds(self) -> float:
        """``after`` in seconds."""
        return seconds(self.after)


class Policy(BaseModel):
    """A reclaim policy (see the module doc and docs/reclaim.md)."""

    model_config = ConfigDict(extra="forbid")
    dry_run: bool = Field(default=True, description="log and export every decision, run no action")
    interval: str = Field(default="1m", description="how often the ladder is evaluated (its tick)")
    idle_share: float = Field(
        default=0.95,
        ge=0.5,
        le=1.0,
        description="a tick counts as idle when at least this share of the job's held GPU time was reclaimable",
    )
    coverage: float = Field(
        default=0.9, gt=0, le=1.0, description="... and the job held each of its GPUs at least this share of it"
    )
    reclaimable_causes: list[str] = Field(
        default_factory=lambda: ["held_idle", "allocated_idle"],
        min_length=1,
        description="idle causes (gpu_idle_seconds_total) that climb the ladder: held_idle (a process holds the GPU, "
        "nothing works) and allocated_idle (allocated to the job, never opened) by default; paused (the job idles "
        "within seconds of GPU work) is also how a server waiting for requests reads, so it is not climbed by default",
    )
    climbing_verdicts: list[str] = Field(
        default_factory=lambda: ["held_idle", "allocated_idle"],
        description="verdicts a job may be given and still climb: any other verdict for one of its GPUs in a tick "
        "(input_starved, launch_bound, waiting_on_peers, checkpoint_bound, ...) makes the tick not idle",
    )
    selector: str = Field(
        default="",
        description="label matchers for every series the ladder reads (the nodes': cluster, instance, job); "
        "a job's labels go in job_selector",
    )
    job_selector: str = Field(
        default="",
        description="label matchers for the jobs that may climb, on their gpu_job_info series (job_kind, job_id, "
        "namespace, pod, slurm_job_id), or gpu_process_job_info where one names user, pid or process_name (a job "
        'allocated GPUs it never opened has no process, so it never matches those), e.g. job_kind="slurm"',
    )
    exempt_jobs: list[str] = Field(default_factory=list, description="job ids never climbing (full-match regexes)")
    steps: list[Step] = Field(min_length=1, max_length=10)
    max_concurrent_actions: int = Field(default=4, ge=1, le=64, description="actions running at once")

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        seconds(value)
        return value

    @field_validator("reclaimable_causes")
    @classmethod
    def _causes(cls, value: list[str]) -> list[str]:
        for cause in value:
            if cause not in IDLE_CAUSES or cause in _NOT_RECLAIMABLE:
                allowed = ", ".join(c for c in IDLE_CAUSES if c not in _NOT_RECLAIMABLE)
                raise ValueError(f"{cause!r} is not an idle cause a job can be reclaimed for ({allowed})")
        return value

    @field_validator("climbing_verdicts")
    @classmethod
    def _verdicts(cls, value: list[str]) -> list[str]:
        for verdict in value:
            if verdict not in VERDICT_ORDER:
                raise ValueError(f"{verdict!r} is not a verdict ({', '.join(VERDICT_ORDER)})")
        return value

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', value)
        named = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", unquoted))
        jobs = sorted(named & JOB_LABELS)
        if jobs:
            raise ValueError(
                f"selector matches every series the ladder reads, and {', '.join(jobs)} is a label "
                "of the jobs only (no GPU counter has it: nothing would climb); put it in job_selector"
            )
        return value

    @field_validator("exempt_jobs")
    @classmethod
    def _exempt(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {pattern!r} ({exc})") from None
        return value

    @model_validator(mode="after")
    def _ladder(self) -> Policy:
        afters = [s.after_seconds for s in self.steps]
        if any(b <= a for a, b in zip(afters, afters[1:], strict=False)):
            raise ValueError("steps: each step's after must be longer than the one before")
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError("steps: step names must differ")
        if afters[0] < self.interval_seconds:
            raise ValueError(f"steps: the first step's after ({self.steps[0].after}) is shorter than interval")
        return self

    @property
    def interval_seconds(self) -> float:
        """``interval`` in seconds."""
        return seconds(self.interval)

    def exempt(self, job_id: str) -> bool:
        """Whether ``job_id`` is exempt (matches one of ``exempt_jobs`` whole)."""
        return any(re.fullmatch(p, job_id) for p in self.exempt_jobs)

    def blocking_verdicts(self) -> frozenset[str]:
        """The verdicts that make a tick not idle: every verdict but ``climbing_verdicts`` and ``free``."""
        return frozenset(VERDICT_ORDER) - set(self.climbing_verdicts) - {"free"}


def load_policy(path: Path) -> Policy:
    """Read and validate the policy file ``path``. Raises PolicyError (one line: the file, the key, the problem)."""
    try:
        data = read_yaml(path)
    except ConfigError as exc:
        raise PolicyError(str(exc)) from None
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"{path}: {_one_line(exc)}") from None


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    value: Any = err.get("input")
    shown = ""
    if isinstance(value, str | int | float | bool):
        text = repr(value)
        shown = f" (got {text[:60]}{'...' if len(text) > 60 else ''})"
    return f"{key + ': ' if key else ''}{msg}{shown}".replace("\n", " ")
