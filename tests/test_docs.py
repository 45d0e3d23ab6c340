"""The generated documents equal what the declarations give, and the declarations equal what is exported."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TRACES, render, replay_poller
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.catalog import FAMILIES, FAMILY, READINGS
from gpuwarden.collectors import missing_builders
from gpuwarden.docs import with_rule_table, with_trace_fields
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.model import GpuReading
from gpuwarden.replay import demo_trace_path

DOCS = Path(__file__).parent.parent / "docs"


def test_every_declared_family_is_in_metrics_md() -> None:
    text = (DOCS / "metrics.md").read_text()
    for fam in FAMILIES:
        assert f"| `{fam.name}` |" in text, fam.name


def test_trace_format_field_list_is_generated() -> None:
    text = (DOCS / "trace-format.md").read_text()
    for name in GpuReading.model_fields:
        assert f"- `{name}`" in text, name


def test_the_verdict_rule_table_is_generated_from_the_rules_in_their_order() -> None:
    from gpuwarden.insight.reasons import VERDICT_ORDER

    text = (DOCS / "scores.md").read_text()
    rows = [line.split("|")[2].strip(" `") for line in text.splitlines() if line.startswith("| ") and "` | " in line]
    table = [r for r in rows if r in VERDICT_ORDER or r == "gpu_lost"]
    assert [r for r in table if r != "gpu_lost"] == list(VERDICT_ORDER)
    with pytest.raises(ValueError, match="no generated-rules markers"):
        with_rule_table("# Scores\n")


def test_trace_format_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="no generated-fields markers"):
        with_trace_fields("# Trace format\n")


def test_every_hand_written_family_has_a_builder() -> None:
    assert missing_builders() == []


def test_every_declared_reading_is_a_model_field() -> None:
    for r in READINGS:
        assert r.field in GpuReading.model_fields, r.field


@pytest.mark.parametrize(
    "path", [demo_trace_path(), demo_trace_path("faults"), *sorted(TRACES.glob("*.jsonl.gz"))], ids=lambda p: p.name
)
def test_every_exported_family_is_declared_as_exported(path: Path) -> None:
    """What the collectors yield over real recordings has exactly the declared name, type, help and labels."""
    poller = replay_poller(path, 10, analyzers={"insight": InsightAnalyzer().prepare})
    assert poller.snapshot is not None
    for fam in text_string_to_metric_families(render(poller.snapshot)):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        declared = FAMILY.get(name)
        assert declared is not None, f"{name} is exported but not declared in gpuwarden/catalog.py"
        # the text format 0.0.4 shows an info family as a gauge named *_info whose labels are its values
        assert fam.type == ("gauge" if declared.type == "info" else declared.type), name
        assert fam.documentation == declared.help.format(window="300"), name
        allowed = set(declared.all_labels) | (set(declared.labels) if declared.type == "info" else set())
        labels = {k for s in fam.samples for k in s.labels}
        assert labels <= allowed, (name, labels - allowed)
