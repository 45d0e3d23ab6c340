"""Writes tests/data/traces/derived-h100-health.jsonl.gz: a real H100 recording given the health faults on-call
engineers meet, to test that the diagnosis reports them next to its verdict.

It takes tests/data/traces/h100-compute_bound.jsonl.gz (recorded on a real H100, see tests/data/README.md) and, in
every GPU record, sets 3 uncorrectable volatile ECC errors (present from the first poll), a pending row remap, the
GPU temperature 2 °C below the card's own slowdown threshold, and adds XID 63 at the fifth poll. The header says so
in ``metadata.modified``. Run: PYTHONPATH=. python3 tests/data/make_health_trace.py
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.model import XidEvent
from gpuwarden.trace import TraceWriter, read_trace

HERE = Path(__file__).parent
SOURCE = HERE / "traces" / "h100-compute_bound.jsonl.gz"
OUT = HERE / "traces" / "derived-h100-health.jsonl.gz"


def main(out: Path = OUT) -> None:
    """Write the derived trace to ``out``."""
    header, polls = read_trace(SOURCE)
    slowdown = header.node.gpus[0].temperature_thresholds_celsius["slowdown"]
    header = header.model_copy(
        update={
            "metadata": {
                **header.metadata,
                "expected_findings": ["hot", "uncorrectable_ecc", "xid_errors", "row_remap_pending"],
                "derived_from": "tests/data/traces/h100-compute_bound.jsonl.gz",
                "modified": "ecc_errors_total.uncorrected_volatile set to 3 and remapped_rows.pending to 1 in every "
                f"record, temperature_gpu_celsius raised to {slowdown - 2:g} (slowdown {slowdown:g} - 2), XID 63 "
                "added at poll 5: health findings for tests/test_insight_kinds.py",
            }
        }
    )
    with TraceWriter(out, header) as w:
        for n, p in enumerate(polls):
            gpus = []
            for g in p.gpus:
                update = {
                    "ecc_errors_total": {**g.ecc_errors_total, "uncorrected_volatile": 3},
                    "remapped_rows": {**g.remapped_rows, "pending": 1},
                    "temperature_gpu_celsius": slowdown - 2,
                }
                if n == 4:
                    update["xid_events"] = [XidEvent(timestamp=g.timestamp, xid=63)]
                gpus.append(g.model_copy(update=update))
            w.write(p.model_copy(update={"gpus": gpus}))


if __name__ == "__main__":
    main()
