"""Process trees at O(the job): a GPU process's descendants come from /proc/PID/task/*/children (or one /proc scan per
refresh where the kernel has none), are walked again only at the refresh cadence, and a process on several GPUs is
read once per poll. Real local processes (a parent shell with sleeping children), no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpuwarden import procinfo
from gpuwarden.procinfo import ProcessInspector, children_files, descendants, read_children, scan_children


@pytest.fixture
def tree() -> Iterator[tuple[int, set[int]]]:
    """A shell with two sleeping children and a shell child with a sleeping child: (root pid, the 4 descendants)."""
    root = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & sh -c 'sleep 60 & wait' & wait"])
    try:
        deadline = time.monotonic() + 10
        while True:
            kids = {p.pid for p in psutil.Process(root.pid).children(recursive=True)}
            if len(kids) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.02)  # the shells fork their children: wait until all four exist
        assert len(kids) == 4, kids
        yield root.pid, kids
    finally:
        for p in psutil.Process(root.pid).children(recursive=True):
            p.kill()
        root.kill()
        root.wait()


def test_children_files_and_the_proc_scan_find_the_same_descendants(tree: tuple[int, set[int]]) -> None:
    root, kids = tree
    assert children_files(), "this kernel has CONFIG_PROC_CHILDREN"
    assert set(descendants(root, read_children)) == kids
    parents = scan_children()
    assert set(descendants(root, lambda p: parents.get(p, []))) == kids
    assert read_children(2**22 + 7) == []  # no such process: no children, no error


def test_a_poll_reads_the_tree_without_scanning_the_host(tree: tuple[int, set[int]], monkeypatch) -> None:  # noqa: ANN001
    root, kids = tree

    def no_host_walks(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a host-wide walk in the poll")

    monkeypatch.setattr(psutil.Process, "children", no_host_walks)
    monkeypatch.setattr(procinfo, "scan_children", no_host_walks)
    inspector = ProcessInspector(tree_refresh=60.0)
    for _ in range(3):
        inspector.new_poll()
        first = inspector.describe(root, 1 << 30)
        again = inspector.describe(root, 2 << 30)  # the same process on a second GPU
    assert first.tree_processes == 1 + len(kids) and again.tree_processes == first.tree_processes
    assert again.gpu_memory_bytes == 2 << 30 and first.gpu_memory_bytes == 1 << 30
    assert inspector.walks == 1  # one walk, then the members' own counters at each poll


def test_without_children_files_one_scan_per_refresh_serves_every_gpu_process(
    tree: tuple[int, set[int]], monkeypatch
) -> None:  # noqa: ANN001
    root, kids = tree
    monkeypatch.setitem(procinfo._CHILDREN_FILES, Path("/proc"), False)
    scans = []
    real = procinfo.scan_children

    def counted(root: Path = Path("/proc")) -> dict[int, list[int]]:
        scans.append(1)
        return real(root)

    monkeypatch.setattr(procinfo, "scan_children", counted)
    inspector = ProcessInspector(tree_refresh=0.0)  # walk at every poll: the scan is still shared within it
    inspector.new_poll()
    a = inspector.describe(root, None)
    b = inspector.describe(min(kids), None)  # a second GPU process
    assert a.tree_processes == 1 + len(kids) and b.tree_processes is not None
    assert len(scans) <= 2  # at most one per refresh; with tree_refresh 0 the two walks may each rescan


def test_a_new_worker_is_seen_at_the_next_refresh(tree: tuple[int, set[int]]) -> None:
    root, kids = tree
    inspector = ProcessInspector(tree_refresh=0.05)
    inspector.new_poll()
    before = inspector.describe(root, None).tree_processes
    for p in psutil.Process(root).children():
        if p.name() == "sleep":
            p.kill()
            break
    deadline = time.monotonic() + 10
    after = before
    while after == before and time.monotonic() < deadline:
        time.sleep(0.06)  # past the refresh
        inspector.new_poll()
        after = inspector.describe(root, None).tree_processes
    assert after == (before or 0) - 1


def test_a_tree_reports_its_writes_reads_and_waits(tmp_path: Path) -> None:
    """A shell whose child writes 4 MiB, reads a file through cat and sleeps in 20 short naps: the tree's counters
    (/proc/PID/io write_bytes and rchar, /proc/PID/status voluntary_ctxt_switches) grow by at least that."""
    src = tmp_path / "src"
    src.write_bytes(b"x" * 2**20)
    script = (
        f"dd if=/dev/zero of={tmp_path / 'out'} bs=1M count=4 conv=fsync 2>/dev/null; "
        f"for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do sleep 0.01; done; "
        f"cat {src} > /dev/null; touch {tmp_path / 'done'}; sleep 60"
    )
    root = subprocess.Popen(["sh", "-c", script])
    try:
        inspector = ProcessInspector()
        inspector.new_poll()
        before = inspector.describe(root.pid, None)
        deadline = time.monotonic() + 30
        while not (tmp_path / "done").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # cat's counters reach its parent when it is reaped, or stay in the tree while it lives
        inspector.new_poll()
        after = inspector.describe(root.pid, None)
        assert before.tree_voluntary_switches_total is not None and after.tree_voluntary_switches_total is not None
        assert after.tree_voluntary_switches_total - before.tree_voluntary_switches_total >= 20
        assert after.tree_read_chars_total is not None and after.tree_write_bytes_total is not None
        assert (after.tree_read_chars_total or 0) >= 0 and after.tree_write_bytes_total >= 0
    finally:
        root.kill()
        root.wait()


def test_the_process_keeping_a_device_file_open_is_found_once_per_change(tmp_path: Path) -> None:
    """The keepers of a GPU's memory whose owner exited: the live processes with its device file and CUDA's open,
    found in the real /proc (a child of this test holding files standing for /dev/nvidia7 and /dev/nvidia-uvm; this
    process, holding the first alone as NVML does, is none), asked again only when the unknown PIDs change."""
    device, uvm = tmp_path / "nvidia7", tmp_path / "nvidia-uvm"
    device.write_text("")
    uvm.write_text("")
    code = f"import time; a = open({str(device)!r}); b = open({str(uvm)!r}); print('ok', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    inspector = ProcessInspector()
    try:
        assert child.stdout is not None and child.stdout.readline() == "ok\n"
        with open(device), pytest.MonkeyPatch.context() as mp:
            mp.setattr(procinfo, "DEVICE_FILE", str(tmp_path / "nvidia{minor}"))
            mp.setattr(procinfo, "UVM_FILE", str(uvm))
            assert inspector.keepers(7, frozenset({999_999}), set()) == [child.pid]
            assert inspector.keepers(7, frozenset({999_999}), set()) == [child.pid]
            assert inspector.keeper_scans == 1  # the same question: no scan
            assert inspector.keepers(7, frozenset({999_998}), {child.pid}) == []  # a listed process keeps nothing
            assert inspector.keepers(7, frozenset(), set()) == [] and inspector.keeper_scans == 2
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("env", "rank", "local_rank"),
    [
        ({"RANK": "3", "LOCAL_RANK": "1"}, 3, 1),  # torchrun
        ({"SLURM_PROCID": "5", "SLURM_LOCALID": "2"}, 5, 2),  # srun
        ({"OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "SLURM_PROCID": "9"}, 9, 0),  # srun first
        ({"RANK": "1; rm -rf /", "LOCAL_RANK": "99999999"}, None, None),  # hostile: not a small number
        ({}, None, None),
    ],
)
def test_a_process_rank_is_read_from_its_environment(
    env: dict[str, str], rank: int | None, local_rank: int | None
) -> None:
    import os

    clean = {k: v for k, v in os.environ.items() if "RANK" not in k and not k.startswith(("SLURM_", "OMPI_"))}
    p = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"],
                         env={**clean, **env}, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"  # running Python, not the fork
        inspector = ProcessInspector()
        inspector.new_poll()
        got = inspector.describe(p.pid, None)
        assert (got.rank, got.local_rank) == (rank, local_rank)
    finally:
        p.kill()
        p.wait()


_LISTENER = """
import os, socket, sys, time
socks = []
for host, port in [("0.0.0.0", int(sys.argv[1])), ("127.0.0.1", 0), ("0.0.0.0", int(sys.argv[2]))]:
    s = socket.socket()
    s.bind((host, port))
    s.listen()
    socks.append(s)
print("up", socks[1].getsockname()[1], flush=True)
time.sleep(60)
"""


def _free_port(below: int) -> int:
    import socket

    for port in range(below - 1, 1024, -1):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def test_a_server_port_is_read_and_the_ports_a_library_was_handed_are_not() -> None:
    """A process listening on a port of its own (a server's), on a port bind(0) gave it (NCCL's bootstrap, a notebook
    kernel's channels) and on MASTER_PORT (torch.distributed's store): only the first is its listen port."""
    import os

    low, _ = procinfo.ephemeral_range()
    server, master = _free_port(low), _free_port(low - 100)
    p = subprocess.Popen([sys.executable, "-c", _LISTENER, str(server), str(master)], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "MASTER_PORT": str(master)})  # fmt: skip
    try:
        assert p.stdout is not None
        word, handed = p.stdout.readline().split()
        assert word == "up" and low <= int(handed)  # the kernel's ephemeral range
        inspector = ProcessInspector()
        inspector.new_poll()
        assert inspector.describe(p.pid, None).listen_ports == [server]
    finally:
        p.kill()
        p.wait()


_FRONT_END = """
import json, os, socket, subprocess, sys, time
host, below, session, env, argv = json.loads(sys.argv[1])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
for port in range(below - 1, 1024, -1) if below else [0]:  # bound here: tests beside this one pick ports too
    try:
        s.bind((host, port))
        break
    except OSError:
        continue
s.listen()
engine = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)", *argv],
                          env={**os.environ, **env}, start_new_session=session, stdout=subprocess.PIPE)
engine.stdout.readline()  # running Python: /proc has its command line and environment (empty while it execs)
print("up", s.getsockname()[1], engine.pid, flush=True)
time.sleep(60)
"""


def _front_end(host: str, below: int, session: bool = False, env: dict[str, str] | None = None,
               argv: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], int, int]:  # fmt: skip
    """A server's front end listening on ``host`` (on the highest free port below ``below``, or one bind(0) gives
    where 0) with its engine, a child process that holds the GPU and does not listen (vLLM's EngineCore, a TorchServe
    worker): (the front end, its port, the engine's pid)."""
    import json

    args = json.dumps([host, below, session, env or {}, list(argv)])
    p = subprocess.Popen([sys.executable, "-c", _FRONT_END, args], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    word, bound, engine = p.stdout.readline().split()
    assert word == "up"
    return p, int(bound), int(engine)


@pytest.mark.parametrize(
    ("host", "ephemeral", "session", "env", "argv", "serves"),
    [
        ("0.0.0.0", False, False, {}, (), True),  # vLLM's API server on 8000, its EngineCore holds the GPU
        ("::", True, False, {}, (), True),  # a gRPC server on [::]:50051-like port, inside the ephemeral range
        ("0.0.0.0", True, False, {}, (), True),  # a server on a port bind(0) gave, on every interface
        ("127.0.0.1", True, False, {}, (), False),  # a helper's loopback channel on a handed-out port
        # the engine in a session of its own (a notebook server starting its kernel, slurmstepd a task): not its job
        ("0.0.0.0", False, True, {}, (), False),
        ("0.0.0.0", False, False, {"WORLD_SIZE": "2"}, (), False),  # a rank under its launcher's store (torchrun)
        ("0.0.0.0", False, False, {}, ("-m", "ipykernel_launcher"), False),  # a notebook kernel under its server
    ],
)
def test_a_server_is_found_where_its_front_end_listens(  # noqa: PLR0913
    host: str, ephemeral: bool, session: bool, env: dict[str, str], argv: tuple[str, ...], serves: bool
) -> None:
    """The GPU process does not listen; its parent does. Its job serves when the parent is its front end: in its
    session, the GPU process not a distributed rank nor a notebook kernel, the socket a server's (server_ports)."""
    low, _ = procinfo.ephemeral_range()
    p, port, engine = _front_end(host, 0 if ephemeral else low - 2000 - 50 * len(argv) - 100 * len(env), session, env,
                                 argv)  # fmt: skip
    try:
        assert (low <= port) == ephemeral
        inspector = ProcessInspector()
        inspector.new_poll()
        assert inspector.describe(engine, None).listen_ports == ([port] if serves else [])
    finally:
        for proc in psutil.Process(p.pid).children():
            proc.kill()
        p.kill()
        p.wait()


def test_the_listen_ports_are_read_again_only_after_the_refresh(monkeypatch) -> None:  # noqa: ANN001
    calls = []
    real = psutil.Process.net_connections

    def counted(self, kind="inet"):  # noqa: ANN001, ANN202
        calls.append(self.pid)
        return real(self, kind)

    monkeypatch.setattr(psutil.Process, "net_connections", counted)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # the module reads time.monotonic()
    inspector = ProcessInspector()
    for _ in range(5):
        inspector.new_poll()
        assert inspector.describe(os.getpid(), None).listen_ports is not None
        clock[0] += 1.0
    # this process, then its ancestors in its session (pytest's own, under xdist its controller), each once
    assert calls[0] == os.getpid() and len(calls) == len(set(calls)) <= 1 + procinfo.SERVER_ANCESTORS
    first = list(calls)
    clock[0] += procinfo.LISTEN_REFRESH_SECONDS
    inspector.new_poll()
    inspector.describe(os.getpid(), None)
    assert calls == first * 2


@pytest.mark.parametrize(
    ("sockets", "rank", "expected"),
    [
        # a server's chosen ports, any address; the libraries' fixed ports never
        ([("0.0.0.0", 8000), ("::", 8001), ("127.0.0.1", 8002), ("0.0.0.0", 29500), ("0.0.0.0", 28028)], False,
         [8000, 8001, 8002]),
        # gRPC's 50051 and a port of the ephemeral range on the wildcard address: a server, whatever the number
        ([("::", 50051), ("0.0.0.0", 45123), ("0.0.0.0", 50051)], False, [45123, 50051]),
        # bind(0) on one address: NCCL's and Gloo's bootstrap on the interface, a notebook's channels on loopback
        ([("10.1.2.3", 40000), ("127.0.0.1", 41000), ("::1", 42000)], False, []),
        # a distributed rank's ephemeral ports are its bootstrap's, on any address; its chosen ports still count
        ([("0.0.0.0", 45123), ("10.1.2.3", 40000), ("0.0.0.0", 8000)], True, [8000]),
        ([], False, []),
        ([("0.0.0.0", 80), ("10.1.2.3", 61000)], False, [80, 61000]),
    ],
)  # fmt: skip
def test_server_ports(sockets: list[tuple[str, int]], rank: bool, expected: list[int]) -> None:
    assert procinfo.server_ports(sockets, (32768, 60999), frozenset({29500, 28028}), rank) == expected


def test_the_libraries_fixed_ports_come_from_the_environment() -> None:
    assert procinfo.library_ports({}) == {28028}  # NCCL's RAS, on by default since NCCL 2.24
    assert procinfo.library_ports({"MASTER_PORT": "29511", "NCCL_RAS_PORT": "28100"}) == {29511, 28100}


def test_a_young_process_is_read_again_sooner() -> None:
    """A server's engine holds the GPU before its front end listens: its job is read again after a quarter of its
    age (at least every 5 s), an old process's every 30 s, one of unknown age's every 30 s."""
    assert procinfo.listen_refresh(8.0) == procinfo.LISTEN_REFRESH_MIN_SECONDS
    assert procinfo.listen_refresh(60.0) == 15.0
    assert procinfo.listen_refresh(3600.0) == procinfo.LISTEN_REFRESH_SECONDS
    assert procinfo.listen_refresh(None) == procinfo.LISTEN_REFRESH_SECONDS
