#!/usr/bin/env python3
"""Write tests/data/traces/derived-8gpu.jsonl.gz: an 8-GPU trace made from the real 2x H200 recording.

Issue 5 asks for a load test against 8 replayed GPUs; no 8-GPU node was available to record, so this
script copies the two recorded H200s of ``h200x2-ddp_straggler.jsonl.gz`` four times each: GPU ``i``
is recorded GPU ``i % 2`` with index ``i``, minor number ``i``, and a new UUID, serial and PCI bus id
(so that every series is distinct). Every reading is the recorded one, unchanged. The header says so in
``metadata.modified`` and ``metadata.derived_from`` (docs/trace-format.md). The output is byte-for-byte
reproducible (gzip mtime 0).

Usage: ``python3 tools/make_8gpu_trace.py [--source FILE] [--out FILE] [--gpus N]``
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuwarden.model import GpuReading, GpuStatic, PollResult  # noqa: E402
from gpuwarden.trace import TraceHeader, TraceWriter, read_trace  # noqa: E402

SOURCE = REPO / "tests/data/traces/h200x2-ddp_straggler.jsonl.gz"
OUT = REPO / "tests/data/traces/derived-8gpu.jsonl.gz"
_NAMESPACE = uuid.UUID("6f1c2a4e-2b7d-4d0e-9a53-9c1f0b6e8d21")


def derived_uuid(original: str, index: int) -> str:
    """Return a stable, distinct NVML-style UUID ("GPU-...") for copy ``index`` of the GPU ``original``."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{original}/{index}')}"


def copy_static(s: GpuStatic, index: int) -> GpuStatic:
    """Return recorded GPU ``s`` as GPU ``index``: new index, UUID, serial, PCI bus id and minor number."""
    return s.model_copy(
        update={
            "index": index,
            "uuid": derived_uuid(s.uuid, index),
            "serial": f"{s.serial or 'derived'}-{index}",
            "pci_bus_id": f"00000000:{0x18 + index:02x}:00.0",
            "minor_number": index,
        }
    )


def derive(source: Path, n: int) -> tuple[TraceHeader, list[PollResult]]:
    """Return the header and polls of an ``n``-GPU trace made from ``source`` (see the module doc)."""
    header, polls = read_trace(source)
    recorded = header.node.gpus
    statics = [copy_static(recorded[i % len(recorded)], i) for i in range(n)]
    node = header.node.model_copy(update={"gpus": statics})
    metadata = {
        **header.metadata,
        "derived_from": f"tests/data/traces/{source.name}",
        "modified": (
            f"{n} GPUs made from the {len(recorded)} recorded ones by tools/make_8gpu_trace.py: GPU i is recorded "
            f"GPU i mod {len(recorded)} with index i, a new UUID, serial, PCI bus id and minor number; every reading "
            "unchanged. Why: the load test asks for 8 replayed GPUs and no 8-GPU node was available to record."
        ),
    }
    expected = header.metadata.get("expected_verdicts")
    if isinstance(expected, dict):  # GPU i is expected what its recorded GPU is
        metadata["expected_verdicts"] = {str(i): expected[str(i % len(recorded))] for i in range(n)}
    new_header = header.model_copy(update={"node": node, "metadata": metadata})
    out = []
    for p in polls:
        by_index = {g.index: g for g in p.gpus}
        gpus: list[GpuReading] = []
        for s in statics:
            g = by_index[s.index % len(recorded)]
            gpus.append(g.model_copy(update={"index": s.index, "uuid": s.uuid}))
        out.append(p.model_copy(update={"gpus": gpus}))
    return new_header, out


def write(path: Path, header: TraceHeader, polls: list[PollResult]) -> None:
    """Write the trace at ``path`` (gzip with mtime 0 when it ends in .gz, so reruns give the same bytes)."""
    plain = path.with_suffix("") if path.suffix == ".gz" else path
    tmp = plain.with_name(plain.name + ".tmp")
    with TraceWriter(tmp, header) as w:
        for p in polls:
            w.write(p)
    data = tmp.read_bytes()
    tmp.unlink()
    if path.suffix == ".gz":
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
            gz.write(data)
        data = buf.getvalue()
    path.write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    """Write the derived trace; return 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args(argv)
    header, polls = derive(args.source, args.gpus)
    write(args.out, header, polls)
    print(f"wrote {args.out}: {args.gpus} GPUs, {len(polls)} polls", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
