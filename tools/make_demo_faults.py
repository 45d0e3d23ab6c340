#!/usr/bin/env python3
"""Writes gpuwarden/replay/data/demo-faults.jsonl.gz, the trace of ``gpuwarden serve --demo faults``: a real
recording given the faults an on-call engineer is paged or ticketed for, so that the shipped rules fire within
minutes of the demo starting (docs/prometheus.md walks from ``gpuwarden mixin`` to these alerts in Alertmanager).

It takes tests/data/traces/h100x2-one-of-two.jsonl.gz (2x H100 80GB HBM3, bf16 products on GPU 0 and nothing on
GPU 1, recorded on a real node: tests/data/README.md) and, from poll FAULT_POLL on, gives GPU 0 two uncorrectable
volatile ECC errors and XID 48 (a double-bit ECC error: the GpuUncorrectableEccErrors and GpuCriticalXid pages), and
GPU 1 XID 94 (a contained ECC error: the GpuXidErrors ticket, on a GPU of its own so that the page's inhibition of
its GPU's tickets does not mute it). Every other reading is the recording's. The replay loops the recording, so the
XIDs recur at each pass (every 41 s) and the ECC counter grows by two each pass. The header says so in
``metadata.modified``.

    python3 tools/make_demo_faults.py
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.model import XidEvent
from gpuwarden.trace import TraceWriter, read_trace

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "tests" / "data" / "traces" / "h100x2-one-of-two.jsonl.gz"
OUT = REPO / "gpuwarden" / "replay" / "data" / "demo-faults.jsonl.gz"
#: The poll the faults start at (the recording's first ten seconds are healthy).
FAULT_POLL = 10


def main(out: Path = OUT) -> None:
    """Write the derived trace to ``out``."""
    header, polls = read_trace(SOURCE)
    header = header.model_copy(
        update={
            "metadata": {
                **header.metadata,
                "scenario": "faults: an uncorrectable ECC error and XID 48 on GPU 0, XID 94 on GPU 1",
                "derived_from": "tests/data/traces/h100x2-one-of-two.jsonl.gz",
                "modified": f"from poll {FAULT_POLL} on: GPU 0's ecc_errors_total.uncorrected_volatile and "
                "uncorrected_aggregate set to 2, XID 48 added to GPU 0 and XID 94 to GPU 1 at that poll; "
                "every other reading as recorded. Written by tools/make_demo_faults.py for serve --demo faults",
                "expected_alerts": ["GpuUncorrectableEccErrors", "GpuCriticalXid", "GpuXidErrors"],
            }
        }
    )
    with TraceWriter(out, header) as w:
        for n, p in enumerate(polls):
            gpus = []
            for g in p.gpus:
                update: dict[str, object] = {}
                if n >= FAULT_POLL and g.index == 0:
                    update["ecc_errors_total"] = {**g.ecc_errors_total, "uncorrected_volatile": 2,
                                                  "uncorrected_aggregate": 2}  # fmt: skip
                if n == FAULT_POLL:
                    update["xid_events"] = [XidEvent(timestamp=g.timestamp, xid=48 if g.index == 0 else 94)]
                gpus.append(g.model_copy(update=update))
            w.write(p.model_copy(update={"gpus": gpus}))


if __name__ == "__main__":
    main()
