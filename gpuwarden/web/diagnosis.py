"""The diagnosis as a JSON document: the body of ``GET /api/v1/diagnosis`` and of ``gpuwarden diagnose --json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from gpuwarden.insight.code_evidence import CodeEvidence
from gpuwarden.insight.vocabulary.result import GpuInsight, JobInsight, ProcessJob, snapshot_insight
from gpuwarden.snapshot import NodeSnapshot


class GpuDiagnosisDocument(GpuInsight):
    """One GPU in the diagnosis document: the insight on it (GpuInsight: time accounting, idle causes, held-idle
    energy, scores, verdict, None while there is none yet), its name, and the code evidence of its job (py-spy
    samples, gpuwarden.insight.code_evidence; None unless enabled and taken)."""

    name: str | None = None
    code_evidence: CodeEvidence | None = None


class DiagnosisDocument(BaseModel):
    """The body of ``/api/v1/diagnosis``: every GPU's verdict, the jobs, and the node's imbalance.

    ``available`` is False (and ``reason`` says why) when there is no analysis to report: before the first
    poll, while the data is stale, or when the insight analyzer is not running.
    """

    hostname: str
    source: str
    available: bool
    reason: str | None = None
    timestamp: float | None = Field(default=None, description="Unix seconds of the poll the analysis is from")
    window_seconds: float | None = None
    diagnosis_window_seconds: float | None = None
    node_imbalance_ratio: float | None = None
    node_activity_source: str | None = None
    gpus: list[GpuDiagnosisDocument] = Field(default_factory=list)
    jobs: list[JobInsight] = Field(default_factory=list)
    processes: list[ProcessJob] = Field(default_factory=list)


def diagnosis_document(snapshot: NodeSnapshot) -> DiagnosisDocument:
    """Return the ``/api/v1/diagnosis`` document of ``snapshot`` (reads ``snapshot_insight(snapshot)``).

    Never raises; without a usable analysis the document has ``available`` False and a ``reason``.
    """
    node = snapshot.static
    base: dict[str, Any] = {"hostname": node.hostname, "source": snapshot.source}
    res = snapshot_insight(snapshot)
    if res is None:
        return DiagnosisDocument(**base, available=False, reason="the insight analyzer has not run")
    if snapshot.poll is None:
        return DiagnosisDocument(**base, available=False, reason="no current poll (starting, failing or stale)")
    names = {s.uuid: s.name for s in node.gpus}
    code = snapshot.analyses.get("code_evidence")
    evidence: Mapping[str, CodeEvidence] = code if isinstance(code, Mapping) else {}
    return DiagnosisDocument(
        **base,
        available=True,
        timestamp=res.timestamp,
        window_seconds=res.window_seconds,
        diagnosis_window_seconds=res.diagnosis_window_seconds,
        node_imbalance_ratio=res.node_imbalance_ratio,
        node_activity_source=res.node_activity_source,
        gpus=[
            GpuDiagnosisDocument(**dict(g), name=names.get(g.uuid), code_evidence=evidence.get(g.uuid))
            for g in res.gpus
        ],
        jobs=res.jobs,
        processes=res.processes,
    )
