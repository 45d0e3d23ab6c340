"""Process and host facts from /proc, through psutil: what the NVML layer cannot tell.

NVML gives the PIDs that hold a GPU context and their GPU memory; this module adds each process's
name, command line, user, CPU time and cgroup, and the host's CPU times. None of it needs a GPU.

The cost of a poll grows with the GPU jobs, never with the host: a GPU process's descendants (DataLoader workers)
are found by walking ``/proc/PID/task/*/children`` down from it (the kernel's CONFIG_PROC_CHILDREN, on in every
distribution kernel), at most once per TREE_REFRESH_SECONDS; in between, each poll reads only the members' own
counters. A process seen on several GPUs in one poll is read once. Where the kernel has no children files, one
scan of /proc per refresh (not per GPU process, not per poll) gives every parent's children.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

from gpuwarden.model import HostReading, ProcessReading
from gpuwarden.server_requests import RequestReader

_CMDLINE_MAX = 256
#: A GPU's device file, by its minor number (nvmlDeviceGetMinorNumber).
DEVICE_FILE = "/dev/nvidia{minor}"
#: The CUDA driver's unified memory device: a process with a CUDA context has it open, one that only asks NVML (this
#: daemon, nvidia-smi, a DCGM agent) does not.
UVM_FILE = "/dev/nvidia-uvm"
#: Seconds between two reads of a job's listening sockets (a server opens its port once, after loading its model;
#: the read lists each member's descriptors and its network namespace's TCP table, so it is not done every poll).
LISTEN_REFRESH_SECONDS = 30.0
#: ... but a young process is read again after a quarter of its age, at least this often: a server's engine holds
#: the GPU before its front end listens (the model loads first), and a job seen without a port at its start is not
#: left 30 s unrecognised; a training job pays the faster reads only in its first two minutes.
LISTEN_REFRESH_MIN_SECONDS = 5.0


def listen_refresh(age: float | None) -> float:
    """Seconds before a process's listening sockets are read again, given its age in seconds (None: unknown): a
    quarter of its age, within LISTEN_REFRESH_MIN_SECONDS and LISTEN_REFRESH_SECONDS."""
    if age is None:
        return LISTEN_REFRESH_SECONDS
    return min(LISTEN_REFRESH_SECONDS, max(LISTEN_REFRESH_MIN_SECONDS, age / 4))


#: Ancestors of a GPU process searched for a server's listening socket (an engine process under its front end: vLLM's
#: EngineCore under its API server, a TorchServe or Triton backend worker under the server; tensor-parallel workers
#: under an EngineCore under the API server), each in the GPU process's session and of its user.
SERVER_ANCESTORS = 3
#: Where bind(0) takes its ports when /proc says nothing (Linux's default ip_local_port_range).
EPHEMERAL_DEFAULT = (32768, 60999)


def ephemeral_range(proc_root: Path = Path("/proc")) -> tuple[int, int]:
    """The kernel's ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range, this namespace's): the ports a
    socket bound to port 0 is given. EPHEMERAL_DEFAULT where it cannot be read. Raises nothing."""
    try:
        low, high = (proc_root / "sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


#: NCCL's RAS subsystem (NCCL 2.24 and later, on by default) listens for its ncclras client on localhost at this port
#: in every process that initialises NCCL, unless NCCL_RAS_ADDR names another.
NCCL_RAS_PORT = 28028


def library_ports(env: dict[str, str]) -> frozenset[int]:
    """The fixed ports a process's libraries listen on, from what ``_environ`` kept of its environment:
    torch.distributed's store (MASTER_PORT) and NCCL's RAS (NCCL_RAS_ADDR's port, else NCCL_RAS_PORT)."""
    ports = {int(env.get("NCCL_RAS_PORT", NCCL_RAS_PORT))}
    if "MASTER_PORT" in env:
        ports.add(int(env["MASTER_PORT"]))
    return frozenset(ports)


def server_ports(
    sockets: list[tuple[str, int]], ephemeral: tuple[int, int], libraries: frozenset[int], rank: bool
) -> list[int]:
    """Of the listening TCP sockets (address, port) of a job's processes, the ports of a server: sorted and unique.

    A server waits for clients outside its job, so it listens on the wildcard address (0.0.0.0, ::) or on a port a
    configuration chose. Left out, by what they are rather than by their number:

    - ``libraries``' fixed ports (``library_ports``: torch.distributed's store on MASTER_PORT, NCCL's RAS);
    - a port of the ``ephemeral`` range (where bind(0) takes ports) bound to one address: NCCL's and Gloo's bootstrap
      listen on port 0 of the interface they chose (NCCL_SOCKET_IFNAME), a notebook kernel's ZMQ channels and
      helper processes on 127.0.0.1 port 0;
    - every ephemeral port of a distributed ``rank`` (a launcher's world size above 1 in its environment, or
      torchrun's TORCHELASTIC_RUN_ID: ``_environ``'s DISTRIBUTED), whose bootstrap sockets may bind the wildcard
      address.

    So gRPC's 50051 on [::] and a server on 0.0.0.0:45000 are servers, inside Linux's ephemeral range or not; a
    loopback server on a chosen port (behind a local proxy) is one too.
    """
    out = set()
    for address, port in sockets:
        if port in libraries:
            continue
        if ephemeral[0] <= port <= ephemeral[1] and (rank or address not in WILDCARD_ADDRESSES):
            continue
        out.add(port)
    return sorted(out)


#: The addresses a socket listens on for every interface (IPv4's and IPv6's "any").
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def _listening(proc: psutil.Process) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket ``proc`` listens on (psutil: /proc/PID/fd and its namespace's
    /proc/net/tcp and tcp6). Raises psutil.Error or OSError where they are not readable."""
    return [(c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]


def _jupyter_kernel(cmd: str | None) -> bool:
    """Whether a command line runs a Jupyter kernel (ipykernel: ``-m ipykernel_launcher -f ...json``)."""
    return cmd is not None and "ipykernel" in cmd


def server_ancestors(proc: psutil.Process) -> list[psutil.Process]:
    """Up to SERVER_ANCESTORS ancestors of ``proc``, nearest first, that may be its server's front end: each in the
    same session as ``proc`` (os.getsid) and of the same real user, never PID 1. The walk stops at the first that is
    not: a login's sshd, slurmstepd, a container's shim or a notebook server (which starts its kernels in a session
    of their own) are never searched. Raises nothing: an ancestor that ended or cannot be read ends the walk."""
    out: list[psutil.Process] = []
    try:
        session, uid = os.getsid(proc.pid), proc.uids().real
        parent = proc.ppid()
        while parent > 1 and len(out) < SERVER_ANCESTORS:
            ancestor = psutil.Process(parent)
            if os.getsid(parent) != session or ancestor.uids().real != uid:
                break
            out.append(ancestor)
            parent = ancestor.ppid()
    except (psutil.Error, OSError):
        pass
    return out


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

    def __init__(
        self,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        proc_root: Path = Path("/proc"),
        tree_refresh: float = 5.0,
        requests: RequestReader | None = None,
    ) -> None:
        self.requests = requests  # reads what a server says of its requests (None: not asked)
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        self.tree_refresh = tree_refresh
        self._procs: dict[int, psutil.Process] = {}
        self._static: dict[int, _Static] = {}
        self._trees: dict[int, _Members] = {}  # GPU process pid -> its descendants, as last walked
        self._polled: dict[int, ProcessReading] = {}  # this poll's readings, by pid
        self._parents: tuple[float, dict[int, list[int]]] | None = None  # the /proc scan, where no children files
        self.walks = 0  # tree walks done (a refresh of one GPU process's descendants)
        self._kept: tuple[tuple[str, frozenset[int]], list[int]] | None = None  # keepers() for its last question
        self.keeper_scans = 0  # /proc/*/fd scans done
        self._listens: dict[int, tuple[float, list[int] | None]] = {}  # pid -> (when read, its chosen listen ports)
        self._ephemeral = ephemeral_range(proc_root)

    def new_poll(self) -> None:
        """Start a poll: a process asked for again in it (one process on several GPUs) is read once."""
        self._polled = {}

    def describe(self, pid: int, gpu_memory_bytes: int | None) -> ProcessReading:
        """Return what /proc tells of ``pid`` (name, cmdline, user, CPU seconds, start, cgroup, and its tree of
        descendants' CPU seconds, count, processes in I/O wait and bytes read)."""
        seen = self._polled.get(pid)
        if seen is not None:
            return seen.model_copy(update={"gpu_memory_bytes": gpu_memory_bytes})
        reading = self._describe(pid, gpu_memory_bytes)
        self._polled[pid] = reading
        return reading

    def _describe(self, pid: int, gpu_memory_bytes: int | None) -> ProcessReading:
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
            with proc.oneshot():  # its CPU times, state, status and io: /proc/PID/stat read once
                cpu = proc.cpu_times()
                tree = _tree(proc, cpu, self._members(proc))
            cpu_total: float | None = cpu.user + cpu.system
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)
            self._static.pop(pid, None)
            self._trees.pop(pid, None)
            return ProcessReading(pid=pid, gpu_memory_bytes=gpu_memory_bytes)
        name, cmd, user, created, cgroup, env = self._static[pid]
        ports = self._listen_ports(proc, env, cmd)
        said = self.requests.latest(pid, ports) if self.requests is not None and ports else None
        return ProcessReading(
            listen_ports=ports,
            server_requests_running=None if said is None else said.running,
            server_requests_waiting=None if said is None else said.waiting,
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
            rank=_rank(env, "RANK"),
            local_rank=_rank(env, "LOCAL_RANK"),
            cgroup_cpu_seconds_total=read_cgroup_cpu(cgroup, self.cgroup_root),
            tree_cpu_seconds_total=tree.cpu_seconds,
            tree_processes=tree.processes,
            tree_blocked=tree.blocked,
            stopped=tree.stopped,
            tree_read_bytes_total=tree.read_bytes,
            tree_read_chars_total=tree.read_chars,
            tree_write_bytes_total=tree.write_bytes,
            tree_voluntary_switches_total=tree.voluntary_switches,
        )

    def _listen_ports(self, proc: psutil.Process, env: dict[str, str], cmd: str | None) -> list[int] | None:
        """The ports a server of ``proc``'s job listens on (``server_ports``) among the listening sockets of ``proc``,
        its descendants and its ancestors (``server_ancestors``), read again when ``listen_refresh`` old. A
        Jupyter kernel has none: its channels and its notebook server's port wait for the notebook, not for clients
        of the GPU. None where ``proc``'s descriptors are not readable (another user's process while gpuwarden is
        neither root nor has CAP_SYS_PTRACE); a member that cannot be read adds nothing."""
        now = time.monotonic()
        seen = self._listens.get(proc.pid)
        created = self._static[proc.pid][3]
        if seen is not None and now - seen[0] < listen_refresh(None if created is None else time.time() - created):
            return seen[1]
        found: list[int] | None = []
        try:
            sockets = _listening(proc)
        except (psutil.Error, OSError, AttributeError):
            found = None
        if found is not None and not _jupyter_kernel(cmd):
            rank = "DISTRIBUTED" in env
            tree = self._trees.get(proc.pid)
            for member in [*(tree.members if tree is not None else ()), *([] if rank else server_ancestors(proc))]:
                try:
                    sockets += _listening(member)
                except (psutil.Error, OSError, AttributeError):
                    continue
            found = server_ports(sockets, self._ephemeral, library_ports(env), rank)
        self._listens[proc.pid] = (now, found)
        return found

    def keepers(self, minor: int, unknown: frozenset[int], listed: set[int]) -> list[int]:
        """The live processes, other than ``listed`` (the GPU's processes NVML lists) and this one, with the GPU's
        device file (DEVICE_FILE of its ``minor`` number) and CUDA's (UVM_FILE) open - a CUDA context, where a
        process that only asks NVML has the first alone: who keeps the memory of ``unknown``, listed PIDs /proc does not
        have (a process that exited while a child it forked after initialising CUDA holds the device open). Sorted.
        One scan of ``/proc/*/fd`` (every process the daemon may read: as root, all), asked again only when the
        device or ``unknown`` changes: the scan grows with the host, so it runs once per change, never per poll."""
        device = DEVICE_FILE.format(minor=minor)
        key = (device, unknown)
        if self._kept is not None and self._kept[0] == key:
            return self._kept[1]
        mine = {os.getpid()}  # NVML's own descriptors, here: no CUDA context, and never a job
        found = [] if not unknown else scan_device_holders({device, UVM_FILE}, self.proc_root, exclude=listed | mine)
        self._kept = (key, found)
        self.keeper_scans += bool(unknown)
        return found

    def forget_except(self, live: set[int]) -> None:
        """Drop cached handles of every PID not in ``live`` (processes that left the GPUs)."""
        if self.requests is not None:
            self.requests.forget_except(live)
        for pid in list(self._procs):
            if pid not in live:
                del self._procs[pid]
                self._static.pop(pid, None)
                self._trees.pop(pid, None)
                self._listens.pop(pid, None)

    def _members(self, proc: psutil.Process) -> list[psutil.Process]:
        """The live descendants of ``proc`` as last walked, walked again when TREE_REFRESH_SECONDS old."""
        now = time.monotonic()
        tree = self._trees.get(proc.pid)
        if tree is not None and now - tree.walked < self.tree_refresh:
            return tree.members
        old = {m.pid: m for m in tree.members} if tree is not None else {}
        members = []
        for pid in self._descendants(proc.pid, now):
            handle = old.get(pid)
            if handle is None:
                try:
                    handle = psutil.Process(pid)
                except psutil.Error:
                    continue  # ended meanwhile
            members.append(handle)
        self._trees[proc.pid] = _Members(now, members)
        self.walks += 1
        return members

    def _descendants(self, pid: int, now: float) -> list[int]:
        """Every descendant of ``pid``, from the children files, or from one /proc scan per refresh without them."""
        if children_files(self.proc_root):
            return descendants(pid, lambda p: read_children(p, self.proc_root))
        if self._parents is None or now - self._parents[0] >= self.tree_refresh:
            self._parents = (now, scan_children(self.proc_root))
        kids = self._parents[1]
        return descendants(pid, lambda p: kids.get(p, []))


def scan_device_holders(
    devices: set[str], proc_root: Path = Path("/proc"), exclude: set[int] | None = None
) -> list[int]:
    """PIDs (sorted) of the processes under ``proc_root`` with an open descriptor on every one of ``devices``
    (paths), leaving out ``exclude``; processes the caller may not inspect (another user's, without root) or that end
    meanwhile are skipped."""
    exclude = exclude or set()
    out = []
    try:
        entries = os.scandir(proc_root)
    except OSError:
        return []
    with entries:
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) in exclude:
                continue
            try:
                fds = os.scandir(os.path.join(entry.path, "fd"))
            except OSError:
                continue
            missing = set(devices)
            with fds:
                for fd in fds:
                    try:
                        missing.discard(os.readlink(fd.path))
                    except OSError:
                        continue
                    if not missing:
                        out.append(int(entry.name))
                        break
    return sorted(out)


def _environ(proc: psutil.Process) -> dict[str, str]:
    """What attribution reads of a process's environment (/proc/PID/environ, through psutil): ``SLURM_JOB_ID`` when it
    is a job id (digits), ``HOSTNAME`` (a container's hostname, its pod's name by default) when it is a DNS name,
    ``RANK`` and ``LOCAL_RANK`` (``_RANKS``) when they are small numbers, ``MASTER_PORT`` and NCCL_RAS_ADDR's port
    (``NCCL_RAS_PORT``) when they are port numbers, ``DISTRIBUTED`` when the process is one rank of several (a
    launcher's world size above 1, ``_WORLD_SIZES``, or torchrun's TORCHELASTIC_RUN_ID).
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
    for key, names in _RANKS.items():
        value = next((env[n] for n in names if n in env), "")
        if value.isdigit() and len(value) <= 7:  # hostile input: a rank is a small number
            out[key] = value
    port = env.get("MASTER_PORT", "")
    if port.isdigit() and len(port) <= 5:
        out["MASTER_PORT"] = port
    ras = env.get("NCCL_RAS_ADDR", "").rpartition(":")[2]
    if ras.isdigit() and len(ras) <= 5:
        out["NCCL_RAS_PORT"] = ras
    if "TORCHELASTIC_RUN_ID" in env or any(_more_than_one(env.get(n, "")) for n in _WORLD_SIZES):
        out["DISTRIBUTED"] = "1"
    return out


#: Where a launcher writes how many ranks a job has: torchrun and torch.distributed, srun, Open MPI, MPICH/Hydra.
_WORLD_SIZES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _more_than_one(value: str) -> bool:
    return value.isdigit() and len(value) <= 7 and int(value) > 1


#: Where a process's rank is in its environment: the launcher's variable, first found wins (torchrun and
#: torch.distributed, then srun, then Open MPI).
_RANKS = {
    "RANK": ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"),
    "LOCAL_RANK": ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
}


def _rank(env: dict[str, str], key: str) -> int | None:
    """The rank ``key`` (RANK or LOCAL_RANK) that ``_environ`` kept, None when absent."""
    value = env.get(key)
    return int(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class _Members:
    """A GPU process's descendants (psutil handles) and when they were walked (time.monotonic)."""

    walked: float
    members: list[psutil.Process]


_CHILDREN_FILES: dict[Path, bool] = {}
_CHILDREN_LOCK = threading.Lock()


def children_files(proc_root: Path = Path("/proc")) -> bool:
    """True when the kernel has ``/proc/PID/task/TID/children`` (CONFIG_PROC_CHILDREN); checked once per root."""
    with _CHILDREN_LOCK:
        if proc_root not in _CHILDREN_FILES:
            me = proc_root / str(os.getpid()) / "task" / str(threading.get_native_id()) / "children"
            _CHILDREN_FILES[proc_root] = me.exists()
        return _CHILDREN_FILES[proc_root]


def read_children(pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The direct children of ``pid``: the PIDs in ``/proc/PID/task/*/children`` (each thread's children); [] when
    the process is gone or unreadable. Costs one read per thread of ``pid``, whatever the host runs."""
    task = proc_root / str(pid) / "task"
    try:
        tids = os.listdir(task)
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(task / tid / "children") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return out


def scan_children(proc_root: Path = Path("/proc")) -> dict[int, list[int]]:
    """Every process's children, from one pass over ``/proc/*/stat`` (the parent PID, field 4): the fallback where
    the kernel has no children files. Costs one read per host process: done once per refresh, for every GPU
    process at once."""
    out: dict[int, list[int]] = {}
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        try:
            with open(proc_root / name / "stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2 :].split(None, 2)[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def descendants(pid: int, children: Callable[[int], list[int]]) -> list[int]:
    """Every descendant of ``pid`` (breadth first), each once, given each process's ``children``."""
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


class Tree(NamedTuple):
    """What a GPU process and its live descendants did, summed (None: not readable for one of them, e.g. /proc/PID/io
    of another user's process without CAP_SYS_PTRACE)."""

    cpu_seconds: float
    processes: int
    blocked: int
    stopped: bool  # the process itself (not its descendants): state T (stopped) or t (tracing stop)
    read_bytes: int | None
    read_chars: int | None
    write_bytes: int | None
    voluntary_switches: int | None


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _io(proc: psutil.Process) -> tuple[int | None, int | None, int | None]:
    """(read_bytes, rchar, write_bytes) of /proc/PID/io; Nones where unreadable."""
    try:
        io = proc.io_counters()
    except (psutil.Error, AttributeError, OSError):
        return None, None, None
    chars = getattr(io, "read_chars", None)
    return int(io.read_bytes), None if chars is None else int(chars), int(io.write_bytes)


def _switches(proc: psutil.Process) -> int | None:
    try:
        return int(proc.num_ctx_switches().voluntary)
    except (psutil.Error, AttributeError, OSError):
        return None


def _tree(proc: psutil.Process, cpu: object, members: list[psutil.Process]) -> Tree:
    """What ``proc`` and its live descendants (``members``) did (Tree), the CPU including its reaped children's
    (psutil's children_user/children_system). Raises psutil.Error for ``proc``. Call it inside ``proc.oneshot()``."""
    seconds = sum(getattr(cpu, k, 0.0) for k in ("user", "system", "children_user", "children_system"))
    status = proc.status()
    blocked = int(status == psutil.STATUS_DISK_SLEEP)
    stopped = status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    read, chars, written = _io(proc)
    switches = _switches(proc)
    count = 1
    for child in members:
        try:
            with child.oneshot():
                t = child.cpu_times()
                child_blocked = child.status() == psutil.STATUS_DISK_SLEEP
                c_read, c_chars, c_written = _io(child)
                c_switches = _switches(child)
        except psutil.Error:
            continue  # ended meanwhile
        seconds += t.user + t.system
        blocked += child_blocked
        count += 1
        read, chars, written = _add(read, c_read), _add(chars, c_chars), _add(written, c_written)
        switches = _add(switches, c_switches)
    return Tree(seconds, count, blocked, stopped, read, chars, written, switches)


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
    return HostReading(
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
