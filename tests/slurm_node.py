"""A real Slurm on this host for the end-to-end tests (Debian's slurmctld, slurmd and munge, run as root): a
configuration under a temporary directory with two GPUs declared as gres over stand-in device files, and the shipped
prolog and epilog (deploy/slurm) wrapped to get the job mapping directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import REPO, free_port, stop_all, wait_http

BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "scancel", "scontrol", "sinfo", "squeue")
PROMETHEUS = shutil.which("prometheus")
#: The marks of a test that needs this Slurm and a Prometheus.
NEEDS = [
    pytest.mark.e2e,
    pytest.mark.xdist_group("slurm"),  # one Slurm node at a time on a host (parallel runs: --dist loadgroup)
    pytest.mark.skipif(
        any(shutil.which(b) is None for b in BINARIES) or PROMETHEUS is None,
        reason="Slurm (slurmctld, slurmd, slurm-client), munge or prometheus not installed (CI installs them)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd and munged run as root here"),
]
FIRST_JOB = 4242
SLURM_CONF = """\
ClusterName=gw
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/sock
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
GresTypes=gpu
FirstJobId={first}
MpiDefault=none
ReturnToService=2
Prolog={dir}/prolog.sh
Epilog={dir}/epilog.sh
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
#: slurmd runs the prolog and epilog with Slurm's variables only: these wrappers give them the mapping directory.
WRAPPER = """\
#!/bin/sh
export PATH=/usr/bin:/bin:/usr/sbin:/sbin GPUWARDEN_JOB_MAPPING_DIR={dir}/jobs GPUWARDEN=false \
GPUWARDEN_JOB_RECORDS={dir}/records
exec sh {script}
"""


def wait_for(what: str, check: Callable[[], object], seconds: float = 60.0) -> object:
    """Poll ``check()`` until it returns something true; AssertionError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.5)


@contextmanager
def slurm_node(tmp: Path) -> Iterator[dict[str, str]]:
    """munged, slurmctld and slurmd on this host with SLURM_CONF's configuration under ``tmp``; yields the
    environment the Slurm commands need once the node is idle."""
    host = node_name()
    for sub in ("state", "spool", "munge", "dev", "jobs", "records"):
        (tmp / sub).mkdir()
    for n in range(2):
        (tmp / "dev" / f"nvidia{n}").touch()  # stand-ins: slurmd checks that a gres file exists, nothing more
    (tmp / "slurm.conf").write_text(SLURM_CONF.format(host=host, dir=tmp, first=FIRST_JOB, ctld_port=free_port(),
                                                      d_port=free_port()))  # fmt: skip
    (tmp / "gres.conf").write_text(f"NodeName={host} Name=gpu File={tmp}/dev/nvidia[0-1]\n")
    for name in ("prolog", "epilog"):
        path = tmp / f"{name}.sh"
        path.write_text(WRAPPER.format(dir=tmp, script=REPO / "deploy" / "slurm" / f"{name}.sh"))
        path.chmod(0o755)
    key = tmp / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    env = {**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")}
    munge = subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={tmp}/munge/sock",
                            f"--pid-file={tmp}/munge/pid", f"--log-file={tmp}/munge/log",
                            f"--seed-file={tmp}/munge/seed"], capture_output=True, text=True, check=False)  # fmt: skip
    assert munge.returncode == 0, munge.stderr
    procs = [subprocess.Popen([d, "-D", *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for d, extra in (("slurmctld", ["-i"]), ("slurmd", []))]  # fmt: skip
    try:
        wait_for("the Slurm node to be idle", lambda: out(["sinfo", "-h", "-o", "%T"], env).strip() == "idle")
        yield env
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, check=False)
        # the jobs' steps end (their slurmstepd with them) before the daemons that would reap them stop
        with contextlib.suppress(AssertionError):
            wait_for("the cancelled jobs to end", lambda: not out(["squeue", "-h"], env).strip(), 30)
        stop_all(procs)
        pid = (tmp / "munge" / "pid").read_text().strip() if (tmp / "munge" / "pid").exists() else ""
        if pid.isdigit():
            os.kill(int(pid), 15)


def out(cmd: list[str], env: dict[str, str]) -> str:
    """What ``cmd`` printed on stdout, run with ``env``."""
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=30).stdout


def node_name() -> str:
    """The Slurm node name ``slurm_node`` gives this host (its short host name)."""
    return socket.gethostname().split(".")[0]


def serve_replay(trace: Path, port: int, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``gpuwarden serve --replay TRACE`` on 127.0.0.1:``port`` with ``env`` added to the environment (the job mapping
    directory, the node's name), its output in ``log``; returned once it answers /healthz."""
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gpuwarden", "serve", "--replay", str(trace),
                                 "--web.listen-address", f"127.0.0.1:{port}"], cwd=REPO,
                                env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
    return proc
