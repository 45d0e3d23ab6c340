"""Writes tests/data/traces/derived-h100-hot-full.jsonl.gz: a real H100 recording made to trip the on-call alerts.

It takes tests/data/traces/h100-compute_bound.jsonl.gz (recorded on a real H100, see tests/data/README.md) and
raises, in every GPU record, memory used to 95% of the total and the GPU temperature to 2 °C below the card's
own slowdown threshold, so that GpuMemoryAlmostFull and GpuOverheating fire in the end-to-end alert test. The
header says so in ``metadata.modified``. Run: PYTHONPATH=. python3 tests/data/make_alert_trace.py
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.trace import TraceWriter, read_trace

HERE = Path(__file__).parent
SOURCE = HERE / "traces" / "h100-compute_bound.jsonl.gz"
OUT = HERE / "traces" / "derived-h100-hot-full.jsonl.gz"


def main(out: Path = OUT) -> None:
    """Write the derived trace to ``out``."""
    header, polls = read_trace(SOURCE)
    slowdown = header.node.gpus[0].temperature_thresholds_celsius["slowdown"]
    header = header.model_copy(
        update={
            "metadata": {
                **header.metadata,
                "derived_from": "tests/data/traces/h100-compute_bound.jsonl.gz",
                "modified": f"memory_used_bytes raised to 95% of memory_total_bytes (free lowered to match) and "
                f"temperature_gpu_celsius raised to {slowdown - 2:g} (slowdown {slowdown:g} - 2), to trip "
                "GpuMemoryAlmostFull and GpuOverheating in tests/test_e2e_prometheus.py",
            }
        }
    )
    with TraceWriter(out, header) as w:
        for p in polls:
            gpus = []
            for g in p.gpus:
                used = int(0.95 * g.memory_total_bytes)
                gpus.append(
                    g.model_copy(
                        update={
                            "memory_used_bytes": used,
                            "memory_free_bytes": g.memory_total_bytes - used,
                            "temperature_gpu_celsius": slowdown - 2,
                        }
                    )
                )
            w.write(p.model_copy(update={"gpus": gpus}))


if __name__ == "__main__":
    main()
