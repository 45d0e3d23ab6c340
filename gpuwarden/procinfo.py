"""Process and host facts from /proc, through psutil: what the NVML layer cannot tell.

NVML gives the PIDs that hold a GPU context and their GPU memory; this module adds each process's
name, command line, user, CPU time and cgroup, and the host's CPU times. None of it needs a GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from gpuwarden.model import HostReading, ProcessReading

_CMDLINE_MAX = 256


def read_cgroup(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """Return the process's cgroup path (the cgroup v2 line, else the first v1 line's path).

    Source: /proc/PID/cgroup. Returns None when the file cannot be read (process gone, other
    PID namespace, no permission).
    """
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    first = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2]
        if first is None:
            first = parts[2]
    return first


class ProcessInspector:
    """Describes host processes by PID, caching the psutil handle of each live process.

    ``describe(pid, gpu_memory_bytes)`` returns a ProcessReading; fields of a process that cannot be
    read are None. Handles of processes no longer asked for are dropped by ``forget_except``.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._static: dict[int, tuple[str | None, str | None, str | None, float | None, str | None]] = {}

    def describe(self, pid: int, gpu_memory_bytes: int | None) -> ProcessReading:
        """Return what /proc tells of ``pid`` (name, cmdline, user, CPU seconds, start, cgroup)."""
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = psutil.Process(pid)
                self._procs[pid] = proc
                with proc.oneshot():
                    cmd = " ".join(proc.cmdline())[:_CMDLINE_MAX] or None
                    self._static[pid] = (proc.name(), cmd, _username(proc), proc.create_time(), read_cgroup(pid))
            cpu = proc.cpu_times()
            cpu_total: float | None = cpu.user + cpu.system
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)
            self._static.pop(pid, None)
            return ProcessReading.model_construct(pid=pid, gpu_memory_bytes=gpu_memory_bytes)
        name, cmd, user, created, cgroup = self._static[pid]
        return ProcessReading.model_construct(
            pid=pid,
            gpu_memory_bytes=gpu_memory_bytes,
            name=name,
            cmdline=cmd,
            username=user,
            cpu_seconds_total=cpu_total,
            create_time=created,
            cgroup=cgroup,
        )

    def forget_except(self, live: set[int]) -> None:
        """Drop cached handles of every PID not in ``live`` (processes that left the GPUs)."""
        for pid in list(self._procs):
            if pid not in live:
                del self._procs[pid]
                self._static.pop(pid, None)


def _username(proc: psutil.Process) -> str | None:
    try:
        return proc.username()
    except (psutil.Error, KeyError):
        return None


def read_host() -> HostReading:
    """Return the host's cumulative CPU seconds per mode (psutil.cpu_times) and its core count."""
    times = psutil.cpu_times()._asdict()
    return HostReading.model_construct(
        timestamp=time.time(), cpu_count=psutil.cpu_count() or 1, cpu_seconds_total=times
    )
