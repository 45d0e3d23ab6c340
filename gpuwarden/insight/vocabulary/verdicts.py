"""The diagnosis as it is served: one GPU's verdict (``Diagnosis``) and the numbers behind it (``Evidence``).

Frozen pydantic models: ``/api/v1/diagnosis``, ``gpuwarden diagnose`` and the node page read them from other threads
while the analyzer accounts the next poll.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Evidence(BaseModel):
    """One number behind a verdict: its name, value, unit and the rule it was compared with (if any)."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: float
    unit: str = Field(description="ratio (0-1), bytes_per_second, cores, bytes, watts or seconds")
    rule: str | None = Field(default=None, description="the threshold this value met or missed, in words")


class Diagnosis(BaseModel):
    """The verdict on one GPU over the diagnosis window.

    ``verdict`` is one of REASONS; ``findings`` every reason that applies (the verdict first, then
    ``throttled`` / ``memory_nearly_full`` where they hold); ``severity`` ok / info / warning.
    """

    model_config = ConfigDict(frozen=True)

    gpu: int
    uuid: str
    verdict: str
    severity: str
    summary: str
    findings: list[str]
    evidence: list[Evidence]
    remedies: list[str]
    window_seconds: float = Field(description="seconds of history the verdict is based on")
    job: str | None = Field(default=None, description="the job holding most of the GPU's memory")
    job_kind: str | None = None
    alternatives: list[str] = Field(
        default_factory=list,
        description="verdicts the same window gives with one of its numbers moved by the margin (15%): the evidence "
        "sits near their line, and gpuwarden cannot tell the verdict from them with confidence",
    )

    def value(self, name: str) -> float | None:
        """Return the value of the evidence called ``name`` (its unit as in ``Evidence.unit``), None when absent."""
        return next((e.value for e in self.evidence if e.name == name), None)

    def activity(self) -> float | None:
        """Return the GPU's activity over the diagnosis window as a ratio 0-1: SM activity (GPM) where measured,
        else ``utilization.gpu`` (the share of time a kernel ran); None when neither is in the evidence."""
        sm = self.value("sm_activity")
        return sm if sm is not None else self.value("utilization_gpu")
