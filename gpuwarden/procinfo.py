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


#: What is read once per process: name, command line, user, start time, cgroup path, environment fields.
_Static = tuple[str | None, str | None, str | None, float | None, str | None, dict[str, str]]


class ProcessInspector:
    """Describes host processes by PID, caching the psutil handle of each live process.

    ``describe(pid, gpu_memory_bytes)`` returns a ProcessReading; fields of a process that cannot be
    read are None. Handles of processes no longer asked for are dropped by ``forget_except``.
    """

    def __init__(self, cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
        self.cgroup_root = cgroup_root
        self._procs: dict[int, psutil.Process] = {}
        self._static: dict[int, _Static] = {}

    def describe(self, pid: int, gpu_memory_bytes: int | None) -> ProcessReading:
        """Return what /proc tells of ``pid`` (name, cmdline, user, CPU seconds, start, cgroup)."""
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = psutil.Process(pid)
                self._procs[pid] = proc
                with proc.oneshot():
                    cmd = " ".join(proc.cmdline())[:_CMDLINE_MAX] or None
                    self._static[pid] = (
                        proc.name(), cmd, _username(proc), proc.create_time(), read_cgroup(pid), _environ(proc)
                    )  # fmt: skip
            cpu = proc.cpu_times()
            cpu_total: float | None = cpu.user + cpu.system
            tree = _tree(proc, cpu)
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)
            self._static.pop(pid, None)
            return ProcessReading.model_construct(pid=pid, gpu_memory_bytes=gpu_memory_bytes)
        name, cmd, user, created, cgroup, env = self._static[pid]
        return ProcessReading.model_construct(
            pid=pid,
            gpu_memory_bytes=gpu_memory_bytes,
            name=name,
            cmdline=cmd,
            username=user,
            cpu_seconds_total=cpu_total,
            create_time=created,
            cgroup=cgroup,
            slurm_job_id=env.get("SLURM_JOB_ID"),
            hostname_env=env.get("HOSTNAME"),
            cgroup_cpu_seconds_total=read_cgroup_cpu(cgroup, self.cgroup_root),
            tree_cpu_seconds_total=tree[0],
            tree_processes=tree[1],
            tree_blocked=tree[2],
            tree_read_bytes_total=tree[3],
        )

    def forget_except(self, live: set[int]) -> None:
        """Drop cached handles of every PID not in ``live`` (processes that left the GPUs)."""
        for pid in list(self._procs):
            if pid not in live:
                del self._procs[pid]
                self._static.pop(pid, None)


def _environ(proc: psutil.Process) -> dict[str, str]:
    """What attribution reads of a process's environment (/proc/PID/environ, through psutil): ``SLURM_JOB_ID`` when it
    is a job id (digits), ``HOSTNAME`` (a container's hostname, its pod's name by default) when it is a DNS name.
    Empty when the environment is not readable: another user's process while gpuwarden is neither root nor has
    CAP_SYS_PTRACE. Read once per process: the environment of a running process does not change under it."""
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return {}
    out = {}
    job = env.get("SLURM_JOB_ID", "")
    if job.isdigit() and len(job) <= 20:
        out["SLURM_JOB_ID"] = job
    host = env.get("HOSTNAME", "")
    if 0 < len(host) <= 253 and all(c.isalnum() or c in "-." for c in host):
        out["HOSTNAME"] = host
    return out


def _tree(proc: psutil.Process, cpu: object) -> tuple[float, int, int, int | None]:
    """(CPU seconds, processes, processes in state D, bytes read) of ``proc`` and its live descendants, the CPU
    including its reaped children's (psutil's children_user/children_system). Raises psutil.Error for ``proc``."""
    seconds = sum(getattr(cpu, k, 0.0) for k in ("user", "system", "children_user", "children_system"))
    count, blocked, read = 1, int(proc.status() == psutil.STATUS_DISK_SLEEP), _read_bytes(proc)
    for child in proc.children(recursive=True):
        try:
            with child.oneshot():
                t = child.cpu_times()
                seconds += t.user + t.system
                blocked += child.status() == psutil.STATUS_DISK_SLEEP
                child_read = _read_bytes(child)
        except psutil.Error:
            continue  # ended meanwhile
        count += 1
        read = None if read is None or child_read is None else read + child_read
    return seconds, count, blocked, read


def _read_bytes(proc: psutil.Process) -> int | None:
    try:
        return int(proc.io_counters().read_bytes)
    except (psutil.Error, AttributeError, OSError):
        return None


def read_cgroup_cpu(cgroup: str | None, root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """Return the CPU seconds used by the cgroup at path ``cgroup`` (from /proc/PID/cgroup), None for the root
    cgroup (the whole host, not a job) or where no counter is readable.

    Sources: cgroup v2 ``cpu.stat`` (usage_usec), cgroup v1 ``cpuacct/cpuacct.usage`` (nanoseconds).
    """
    if not cgroup or cgroup == "/":
        return None
    rel = cgroup.lstrip("/")
    try:
        for line in (root / rel / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    try:
        return int((root / "cpuacct" / rel / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


def _username(proc: psutil.Process) -> str | None:
    try:
        return proc.username()
    except (psutil.Error, KeyError):
        return None


def read_host() -> HostReading:
    """Return the host's cumulative CPU seconds per mode (psutil.cpu_times) and its core count."""
    times = psutil.cpu_times()._asdict()
    return HostReading.model_construct(
        timestamp=time.time(),
        cpu_count=psutil.cpu_count() or 1,
        cpu_seconds_total=times,
        pressure_seconds_total=read_pressure(),
    )


def read_pressure(root: Path = Path("/proc/pressure")) -> dict[str, float]:
    """Return PSI's cumulative "some" stall seconds per resource (io, cpu); {} where the kernel has no PSI.

    Source: /proc/pressure/{io,cpu}, line ``some ... total=<microseconds>`` (Linux 4.20+).
    """
    out: dict[str, float] = {}
    for resource in ("io", "cpu"):
        try:
            text = (root / resource).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("some "):
                total = line.rpartition("total=")[2]
                if total.isdigit():
                    out[resource] = int(total) / 1e6
    return out
