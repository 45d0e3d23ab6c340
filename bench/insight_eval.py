"""Replays every recorded trace through the insight analyzer and prints expected against given verdicts.

    python3 -m bench.insight_eval [TRACE ...] [--markdown]

The expected verdicts are in each trace's header (gpuwarden.insight.evaluation). For each trace and GPU it prints
the verdict at the end of the trace, whether it is the expected one, and the share of polls whose verdict was
right. Without arguments it takes every trace under tests/data/traces. Exit status 1 when a final verdict or
expected finding is wrong.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuwarden.insight.evaluation import Row, evaluate

TRACES = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"


def markdown(rows: list[Row]) -> str:
    """Return the rows as a Markdown table (the evaluation table of docs/scores.md)."""
    lines = ["| trace | GPU | expected | given | polls right |", "|---|---|---|---|---|"]
    for r in rows:
        share = "n/a" if r.polls_right is None else f"{r.polls_right:.0%}"
        mark = "" if r.ok else " **(wrong)**"
        lines.append(f"| `{r.trace}` | {r.gpu} | {r.expected} | {r.given}{mark} | {share} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Evaluate the traces, print the table; return 1 when any final verdict is wrong."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*", type=Path)
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    a = p.parse_args(argv)
    paths = a.traces or sorted(TRACES.glob("*.jsonl.gz"))
    rows = [r for path in paths for r in evaluate(path)]
    if a.markdown:
        print(markdown(rows))
    else:
        print(f"{'trace':44s} {'gpu':>3s}  {'expected':18s} {'given':18s} {'polls right':>11s}")
        for r in rows:
            share = "n/a" if r.polls_right is None else f"{r.polls_right:.0%}"
            flag = "" if r.ok else "  WRONG" + (f" (missing {', '.join(r.missing)})" if r.missing else "")
            print(f"{r.trace:44s} {r.gpu:3d}  {r.expected or '-':18s} {r.given or '-':18s} {share:>11s}{flag}")
    good = sum(r.ok for r in rows)
    print(f"\n{good} of {len(rows)} GPUs right", file=sys.stderr)
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
