"""Job attribution from cgroup paths, and over the real traces."""

from __future__ import annotations

import pytest
from test_insight_helpers import DDP, h100, run_trace

from gpuwarden.insight.attribution import JOB_KINDS, MAX_LABEL_CHARS, attribute_cgroup

CID = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
UID = "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"


@pytest.mark.parametrize(
    ("path", "kind", "job", "container"),
    [
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope",
            "kubernetes",
            UID,
            CID[:12],
        ),
        (f"/kubepods/besteffort/pod{UID}/{CID}", "kubernetes", UID, CID[:12]),
        (f"/kubepods/pod{UID}/{CID}", "kubernetes", UID, CID[:12]),
        ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "slurm", "4242", ""),
        ("/slurm/uid_1000/job_77/step_batch/task_0", "slurm", "77", ""),
        # Slurm 26.05: the job's cgroup is named by its SLUID (cluster-wide, as a job id)
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", "slurm", "sEKNKTV3WPV500", ""),
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_extern/user/task_special", "slurm", "sEKNKTV3WPV500", ""),
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500", "slurm", "sEKNKTV3WPV500", ""),
        # not SLUIDs: the stepd's own cgroup, a lower-case or non-base32 name (I, L, O, U are not Crockford digits)
        ("/system.slice/slurmstepd.scope/system", "cgroup", "/system.slice/slurmstepd.scope/system", ""),
        ("/system.slice/slurmstepd.scope/sILOUILOUILOU", "cgroup", "/system.slice/slurmstepd.scope/sILOUILOUILOU", ""),
        (f"/system.slice/docker-{CID}.scope", "container", CID[:12], CID[:12]),
        (f"/docker/{CID}", "container", CID[:12], CID[:12]),
        (f"/machine.slice/libpod-{CID}.scope/container", "container", CID[:12], CID[:12]),
        ("/system.slice/jupyterhub.service", "systemd", "jupyterhub.service", ""),
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/train.service", "systemd", "train.service", ""),
        ("/user.slice/user-1000.slice/session-3.scope", "process", "alice/python3", ""),
        ("/", "process", "alice/python3", ""),
        (None, "process", "alice/python3", ""),
        (
            "/process_api/24fcd87c0ebfd8048e9b01ad72c39366",
            "cgroup",
            "/process_api/24fcd87c0ebfd8048e9b01ad72c39366",
            "",
        ),
    ],
)
def test_cgroup_shapes(path: str | None, kind: str, job: str, container: str) -> None:
    ref = attribute_cgroup(path, "alice", "python3")
    assert (ref.kind, ref.job, ref.container_id) == (kind, job, container)
    assert ref.kind in JOB_KINDS


def test_long_paths_are_cut_to_bound_label_size() -> None:
    ref = attribute_cgroup("/" + "x" * 500)
    assert ref.kind == "cgroup" and len(ref.job) <= MAX_LABEL_CHARS


def test_unknown_user_and_command_fall_back_to_question_marks() -> None:
    assert attribute_cgroup(None).job == "?/?"


def test_ddp_ranks_and_launcher_are_one_job_spanning_both_gpus() -> None:
    if not DDP.exists():
        pytest.skip("2xH200 ddp_straggler trace not recorded")
    _, polls, results = run_trace(DDP)
    res = results[-1]
    pids = {q.pid for g in polls[-1].gpus for q in g.processes}
    assert {p.pid for p in res.processes} == pids
    assert len({(p.job_kind, p.job) for p in res.processes}) == 1
    (job,) = res.jobs
    assert job.gpus == [0, 1] and job.pids == sorted(pids)
    # cpu of each process comes from its own cumulative counter
    last = {q.pid: q for g in polls[-1].gpus for q in g.processes}
    prev = {q.pid: q for g in polls[-2].gpus for q in g.processes}
    dt = polls[-1].gpus[0].timestamp - polls[-2].gpus[0].timestamp
    for p in res.processes:
        assert p.cpu_cores == pytest.approx((last[p.pid].cpu_seconds_total - prev[p.pid].cpu_seconds_total) / dt)


def test_processes_disappear_when_they_end() -> None:
    header_static, polls, _ = run_trace(h100("held_idle"))
    from test_insight_helpers import run

    ended = polls[-1].model_copy(update={"gpus": [g.model_copy(update={"processes": []}) for g in polls[-1].gpus]})
    res = run([*polls, ended], header_static)
    assert res[-2].processes and res[-1].processes == [] and res[-1].jobs == []


@pytest.mark.parametrize(
    ("cgroup", "slurm_job_id", "kind", "job"),
    [
        ("/user.slice/user-1000.slice/session-3.scope", "4243", "slurm", "4243"),  # no slurm cgroup plugin paths
        ("/system.slice/slurmd.service", "4243", "slurm", "4243"),
        ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "9999", "slurm", "4242"),  # the cgroup wins
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", "4242", "slurm", "sEKNKTV3WPV500"),
        ("/user.slice/user-1000.slice/session-3.scope", None, "process", "alice/python3"),
    ],
)
def test_slurm_job_id_from_the_environment_where_the_cgroup_does_not_name_the_job(
    cgroup: str, slurm_job_id: str | None, kind: str, job: str
) -> None:
    from gpuwarden.insight.attribution import attribute
    from gpuwarden.model import ProcessReading

    ref = attribute(ProcessReading(pid=1, cgroup=cgroup, slurm_job_id=slurm_job_id, username="alice", name="python3"))
    assert (ref.kind, ref.job) == (kind, job)


@pytest.mark.parametrize(
    ("cgroup", "slurm_job_id", "number"),
    [
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", "4242", "4242"),  # SLUID, env readable
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", None, ""),  # SLUID, env unreadable
        ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", None, "4242"),  # the id itself is the number
        ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "9999", "4242"),  # the cgroup's id wins
        # hostile environments are not exported: only a plain number is
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", '4242"} 1\nx{', ""),
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", "\x1b[31m4242", ""),
        ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", "4" * 64, ""),
        ("/system.slice/jupyterhub.service", "4242", "4242"),  # the environment made it a Slurm job
        (f"/kubepods/besteffort/pod{UID}/{CID}", "4242", ""),  # a pod stays a pod: no Slurm number
    ],
)
def test_the_numeric_slurm_job_id_is_kept_beside_a_sluid(cgroup: str, slurm_job_id: str | None, number: str) -> None:
    from gpuwarden.insight.attribution import attribute, slurm_job_number
    from gpuwarden.model import ProcessReading

    proc = ProcessReading(pid=1, cgroup=cgroup, slurm_job_id=slurm_job_id, username="alice", name="python3")
    assert slurm_job_number(attribute(proc), proc) == number


@pytest.mark.e2e
def test_the_inspector_reads_slurm_job_id_from_a_real_process_environment() -> None:
    import os
    import subprocess
    import sys

    from gpuwarden.procinfo import ProcessInspector

    env = {**os.environ, "SLURM_JOB_ID": "4243"}
    code = "import time; print('ready', flush=True); time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True) as child:
        try:
            # the child has run (exec'd with its environment): until then /proc shows the forked parent's environ
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            assert ProcessInspector().describe(child.pid, None).slurm_job_id == "4243"
        finally:
            child.kill()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={"SLURM_JOB_ID": "x; rm"}) as c:
        try:
            assert ProcessInspector().describe(c.pid, None).slurm_job_id is None  # not a job id
        finally:
            c.kill()


def test_the_gpus_job_is_a_working_process_not_memory_an_exited_one_left() -> None:
    """NVML goes on listing a process that exited while a child it forked keeps the device open (no /proc entry: no
    start time, user or name; job ``?/?``). Though it holds the most memory, the GPU's job is that of the live
    process, and among live ones that of the process running kernels before a larger idle one."""
    from gpuwarden.insight.analyzer import InsightAnalyzer
    from gpuwarden.model import GpuReading, ProcessReading

    exited = ProcessReading(pid=7, gpu_memory_bytes=1_700_000_000)
    idle = ProcessReading(pid=8, gpu_memory_bytes=1_200_000_000, create_time=100.0, username="bob", name="notebook",
                          cgroup="/system.slice/jupyter.service", sm_utilization_ratio=0.0)  # fmt: skip
    train = ProcessReading(pid=9, gpu_memory_bytes=900_000_000, create_time=200.0, username="carol", name="train",
                           cgroup="/slurm/uid_1/job_4243/step_0/task_0", sm_utilization_ratio=0.4)  # fmt: skip
    an = InsightAnalyzer()
    for procs, job in (([exited, train], "4243"), ([exited, idle], "jupyter.service"),
                       ([exited, idle, train], "4243"), ([exited], "?/?")):  # fmt: skip
        gpu = GpuReading(index=0, uuid="GPU-a", timestamp=1.0, processes=procs)
        _, primary = an._process_jobs([gpu], {})
        assert primary["GPU-a"].job == job, ([p.pid for p in procs], primary["GPU-a"])


def test_a_job_keyed_by_its_sluid_carries_the_slurm_job_number_users_type() -> None:
    """Slurm 26.05 keys a job's cgroup by its SLUID; the node's job row also carries the numeric id (SLURM_JOB_ID of
    its processes), which the node page shows beside it."""
    from conftest import trace

    _, _, results = run_trace(trace("derived-h200x2-slurm-4242-a"))
    jobs = {(j.job_kind, j.job): j for j in results[-1].jobs}
    assert jobs[("slurm", "sEKNKTV3WPV500")].slurm_job_id == "4242"
    assert all(j.slurm_job_id == "" for k, j in jobs.items() if k[0] != "slurm")


def test_a_job_of_no_slurm_process_has_no_slurm_job_number() -> None:
    _, _, results = run_trace(DDP) if DDP.exists() else run_trace(h100("held_idle"))
    assert results[-1].jobs and all(j.slurm_job_id == "" for j in results[-1].jobs)
