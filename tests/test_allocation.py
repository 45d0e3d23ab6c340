"""GPUs a scheduler allocated to a job that no process opened: the job mapping directory (gpuwarden.allocation), the
``allocated`` holder and the ``allocated_idle`` state, cause and verdict, and the job on gpu_job_info, on a real H100
recording of an idle GPU (h100-idle: no process, nothing running)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
from conftest import TRACES, render
from test_collectors import families

from gpuwarden.allocation import MAX_JOBS_PER_GPU, JobMapping, parse, parse_owner
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.insight.vocabulary import states as st
from gpuwarden.model import GpuReading, PodAssignment
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource

IDLE = TRACES / "h100-idle.jsonl.gz"


def test_a_mapping_file_keeps_job_ids_and_leaves_out_anything_else() -> None:
    """Ids one a line (Slurm's: digits, array tasks, heterogeneous components, SLUIDs), each once; escapes, spaces
    inside a line, overlong ids and blank lines are no ids, and what is left out is counted."""
    text = "123\n 456_7 \n\n123\n789+0\nsEKNKTV3WPV500\n\x1b]52;c;evil\x07\nrm -rf /\n" + "9" * 65 + "\n"
    assert parse(text) == (["123", "456_7", "789+0", "sEKNKTV3WPV500"], 3)
    many = "".join(f"{n}\n" for n in range(100))
    assert parse(many) == ([str(n) for n in range(MAX_JOBS_PER_GPU)], 0)


def test_an_owner_file_keeps_user_and_account_names_and_leaves_out_anything_else() -> None:
    """``key=value`` lines of user and account; a name with an escape, a space, a slash or over 64 characters, and
    any other key, are no owner."""
    assert parse_owner("user=alice\naccount=physics\n") == {"user": "alice", "account": "physics"}
    assert parse_owner(" user = bob@corp.example \naccount=\nshell=/bin/sh\n") == {"user": "bob@corp.example"}
    hostile = "user=\x1b]52;c;evil\x07\naccount=a b\nuser=../../etc\naccount=" + "x" * 65 + "\n"
    assert parse_owner(hostile) == {}


def test_the_directory_names_gpus_by_index_and_mig_files_join_their_gpu(tmp_path: Path) -> None:
    """A file a GPU named by its index, MIG instances' files (``2.0``) on their GPU; other names, directories and a
    missing directory are no allocation."""
    mapping = JobMapping(tmp_path / "jobs")
    assert mapping.read() == {}
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "0").write_text("100\n")
    (d / "2.0").write_text("200\n")
    (d / "2.1").write_text("201\n200\n")
    (d / "notes.txt").write_text("300\n")
    (d / "3").mkdir()
    assert mapping.read() == {0: ["100"], 2: ["200", "201"]}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_left_out_and_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "0").write_text("100\n")
    (tmp_path / "1").write_text("101\n")
    (tmp_path / "1").chmod(0)
    mapping = JobMapping(tmp_path)
    with caplog.at_level(logging.WARNING, logger="gpuwarden.allocation"):
        assert mapping.read() == {0: ["100"]}
        assert mapping.read() == {0: ["100"]}
    assert [r.getMessage() for r in caplog.records] == ["a job mapping file is unreadable: Permission denied"]


def test_a_gpu_nobody_opened_is_allocated_idle_when_a_scheduler_gave_it_to_a_job() -> None:
    """No process and no memory in use: ``none`` (free) without an allocation, ``allocated`` with one; its idle time
    is ``allocated_idle`` (a lost idle cause), its kernel time busy. A GPU a process holds is the job's either way."""
    assert st.holder_of(True, 0, 0, True) == "none"
    assert st.holder_of(True, 0, 0, True, allocated=True) == "allocated"
    assert st.holder_of(True, 1, 2**30, True, allocated=True) == "job"
    assert st.holder_of(True, 0, 2**30, True, allocated=True) == "invisible"
    segs = st.segments(0.0, 2.0, [(1.0, 0.0), (2.0, 0.5)], None)
    states, _ = st.account(segs, "allocated", None, None)
    assert states["allocated_idle"] == pytest.approx(1.5) and states["busy"] == pytest.approx(0.5)  # 1 s of 0 and 0.5
    assert states["free"] == 0.0
    assert st.idle_causes(states, None, False)["allocated_idle"] == pytest.approx(1.5)


def _render(polls: int, annotate: object) -> dict:
    poller = Poller(
        ReplaySource(IDLE, timing="recorded", annotate=annotate),  # type: ignore[arg-type]
        1.0,
        analyzers={"insight": InsightAnalyzer().prepare},
    )
    poller.start(thread=False)
    for _ in range(polls - 1):
        poller.poll_once()
    assert poller.snapshot is not None
    return families(render(poller.snapshot))


def _value(fams: dict, name: str, **labels: str) -> float:
    """The sum of family ``name``'s samples with ``labels`` (a counter by its name without _total)."""
    return sum(s.value for s in fams.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_slurm_job_allocated_a_gpu_it_never_opens_holds_it_allocated_idle(tmp_path: Path) -> None:
    """The idle H100 recording, its GPU allocated to Slurm job 4242 by the job mapping directory: its time is
    allocated_idle (state and idle cause), its verdict allocated_idle, and gpu_job_info names the job. Without the
    file the same recording is free."""
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "owners").mkdir()
    (tmp_path / "owners" / "4242").write_text("user=alice\naccount=physics\n")
    fams = _render(30, JobMapping(tmp_path).assign)
    held = _value(fams, "gpu_state_seconds", state="allocated_idle")
    assert held > 20 and _value(fams, "gpu_state_seconds", state="free") == 0
    assert _value(fams, "gpu_idle_seconds", cause="allocated_idle") == pytest.approx(held)
    assert _value(fams, "gpu_diagnosis", reason="allocated_idle") == 1
    jobs = [s.labels for s in fams["gpu_job_info"]]
    assert [(j["job_id"], j["job_kind"], j["job_scope"], j["slurm_job_id"], j["user"], j["account"]) for j in jobs] == [
        ("4242", "slurm", "cluster", "4242", "alice", "physics")
    ]
    free = _render(30, JobMapping(tmp_path / "none").assign)
    assert _value(free, "gpu_state_seconds", state="allocated_idle") == 0
    assert _value(free, "gpu_diagnosis", reason="free") == 1
    assert "gpu_job_info" not in free


def test_a_pod_assigned_a_gpu_it_never_opens_holds_it_allocated_idle() -> None:
    """The kubelet's assignment (pod-resources List) of the idle GPU to a pod with no process on the node: the
    GPU is allocated_idle, and gpu_job_info names the pod by namespace/name (pod-resources gives no UID)."""

    def assign(gpus: list[GpuReading]) -> list[GpuReading]:
        pod = PodAssignment(namespace="ml", pod="notebook-0", container="lab", device_id=gpus[0].uuid,
                            resource="nvidia.com/gpu")  # fmt: skip
        return [g.model_copy(update={"pods": [pod]}) for g in gpus]

    fams = _render(30, assign)
    assert _value(fams, "gpu_state_seconds", state="allocated_idle") > 20
    assert _value(fams, "gpu_diagnosis", reason="allocated_idle") == 1
    [job] = [s.labels for s in fams["gpu_job_info"]]
    assert (job["job_id"], job["job_kind"], job["namespace"], job["pod"]) == ("ml/notebook-0", "kubernetes", "ml",
                                                                             "notebook-0")  # fmt: skip


def _slurm_script(name: str, mapping: Path, tmp: Path, job: str, gpus: str, **owner: str) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus, "SLURMD_NODENAME": "node-b",
           "SLURM_JOB_NODELIST": "node-a", "GPUWARDEN_JOB_MAPPING_DIR": str(mapping),
           "GPUWARDEN_JOB_RECORDS": str(tmp / "records"), "GPUWARDEN": "false", **owner}  # fmt: skip
    script = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / name
    res = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and res.stdout == "", res.stderr


def test_the_slurm_prolog_writes_the_mapping_and_the_epilog_clears_it(tmp_path: Path) -> None:
    """deploy/slurm/prolog.sh and epilog.sh as slurmd runs them (the job's environment; the epilog's record is
    another test's, here its report fails: GPUWARDEN is ``false``): two jobs share GPU 2; an index that is not a
    number is no file; the epilog takes its job's lines out and removes a file left empty."""
    mapping = tmp_path / "jobs"
    _slurm_script(
        "prolog.sh", mapping, tmp_path, "4242", "0,2,../x", SLURM_JOB_USER="alice", SLURM_JOB_ACCOUNT="physics"
    )
    _slurm_script("prolog.sh", mapping, tmp_path, "4343", "2", SLURM_JOB_USER="bob")
    assert sorted(p.name for p in mapping.iterdir()) == ["0", "2", "owners"]
    assert JobMapping(mapping).read() == {0: ["4242"], 2: ["4242", "4343"]}
    assert JobMapping(mapping).owners(["4242", "4343", "9"]) == {"4242": {"user": "alice", "account": "physics"},
                                                                 "4343": {"user": "bob"}}  # fmt: skip
    _slurm_script("epilog.sh", mapping, tmp_path, "4242", "0,2")
    assert JobMapping(mapping).read() == {2: ["4343"]}
    assert sorted(p.name for p in mapping.iterdir()) == ["2", "owners"]
    assert sorted(p.name for p in (mapping / "owners").iterdir()) == ["4343"]


def test_the_fleet_reads_a_jobs_gpus_from_gpu_job_info_unless_a_process_label_is_asked_for() -> None:
    """A job's GPUs in `top`, `report` and `reclaim` come from gpu_job_info, which has the GPUs a scheduler allocated
    and no process opened, and its owner (user, account); a matcher on a label only processes carry (pid,
    process_name) reads gpu_process_job_info. Label names count at a matcher's start only: a value that looks like one
    does not."""
    from gpuwarden.cluster.usage import Accounting

    acc = Accounting(None, "1h", "1m", 'cluster="a"')  # type: ignore[arg-type]
    assert acc.job_series() == 'gpu_job_info{cluster="a"}'
    assert acc.job_series('job_id="4242", instance="n1"') == 'gpu_job_info{cluster="a", job_id="4242", instance="n1"}'
    assert acc.job_series('job_kind="slurm",pid!~"1.*"').startswith("gpu_process_job_info{")
    assert acc.job_series('job_kind="slurm",user!~"svc-.*"').startswith("gpu_job_info{")  # the owner is the job's
    assert acc.job_series('job_id="x, pid=y"').startswith("gpu_job_info{")
    assert acc.job_series('job_id="' + "u" * 100_000 + '"').startswith("gpu_job_info{")
