"""Where a process's resident memory lies: /proc/PID/smaps summed by mapping (each shared library, the heap,
anonymous memory, thread stacks), largest first.

``python3 tools/rss_map.py PID [PID ...] [--top 15]``: one table per process, in KiB, and the process total
(the sum of Rss over all mappings, which is what VmRSS reports).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


def rss_by_mapping(pid: int) -> Counter[str]:
    """Return Rss in KiB per mapping name of process ``pid`` (libraries by file name, ``[anon]`` for anonymous
    memory); raises OSError when the process is gone or not readable."""
    out: Counter[str] = Counter()
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = _HEADER.match(line)
        if m:
            name = Path(m.group(1)).name if m.group(1).startswith("/") else (m.group(1) or "[anon]")
        elif line.startswith("Rss:"):
            out[name] += int(line.split()[1])
    return out


def main() -> None:
    """Print each process's resident memory by mapping."""
    ap = argparse.ArgumentParser()
    ap.add_argument("pids", type=int, nargs="+")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    for pid in args.pids:
        rss = rss_by_mapping(pid)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:100]
        print(f"pid {pid} ({cmd.encode('unicode_escape').decode()}): {sum(rss.values()) / 1024:.1f} MiB")
        for name, kib in rss.most_common(args.top):
            print(f"  {kib / 1024:8.1f} MiB  {name.encode('unicode_escape').decode()}")


if __name__ == "__main__":
    main()
