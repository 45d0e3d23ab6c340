"""``gpuwarden top``'s tables fit the terminal: every job on one line at 80 columns with its id whole (ready to paste
into ``report --job``), the optional columns added only where they fit and the others named below the table; without
a terminal, every column as tab-separated values."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpuwarden.cluster.accounting_queries import Cluster, GpuKey
from gpuwarden.cluster.usage import JobKey, Usage
from gpuwarden.cluster.views import Names, gpus_table, job_details, jobs_table

POD = "3f2b6c1e-8a4d-4e8f-9b7a-0c5d2e1f6a9b"  # a pod UID: 36 characters
SLUID = "sEKNKTV3WPV500"
NODES = {"10.0.0.7:9400": "gpu-node-007.cluster.example", "10.0.0.8:9400": "gpu-node-008.cluster.example"}
NO_CLUSTER: Cluster = ()
NAMES: Names = {(NO_CLUSTER, i): n for i, n in NODES.items()}


def _usage(lost: dict[str, float], held: float, nodes: list[str], gpus: int) -> Usage:
    u = Usage(held_hours=held, busy_hours=held - sum(lost.values()), cost=12.5 * sum(lost.values()), currency="USD")
    u.lost_hours.update(lost)
    u.instances = set(nodes)
    u.gpus = {(n, str(i)) for n in nodes for i in range(gpus)}
    u.reasons = {"input_starved": 30.0, "throttled": 5.0}
    return u


JOBS = [
    (JobKey(POD), _usage({"input_cpu": 37.5, "paused": 2.0, "lost": 1.0}, 96.0, list(NODES), 8)),
    (JobKey(SLUID), _usage({"held_idle": 3.25}, 4.0, ["10.0.0.7:9400"], 1)),
    (JobKey("4242"), _usage({"input_io": 0.5}, 1.0, ["10.0.0.8:9400"], 2)),
]


def _render(table: object, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system=None).print(table)
    return [line for line in out.getvalue().splitlines() if line.strip()]


@pytest.mark.parametrize("width", [80, 100])
def test_every_job_is_one_line_with_its_whole_id_within_the_width(width: int) -> None:
    lines = _render(jobs_table(JOBS, NAMES, "1d", width), width)
    assert all(len(line) <= width for line in lines), lines
    for key, _ in JOBS:
        [row] = [line for line in lines if key.job_id in line]  # whole, on exactly one line
        assert "(" in row and "%)" in row  # its lost share is on that line too
    # title, header, rule, one line per job, then what is not shown
    caption = " ".join(" ".join(lines[3 + len(JOBS) :]).split())
    assert caption.startswith(f"not shown at {width} columns: ") and "--details or --json" in caption


def test_optional_columns_come_only_where_they_fit() -> None:
    narrow_lines = _render(jobs_table(JOBS, NAMES, "1d", 80), 80)
    narrow = "\n".join(narrow_lines)
    wide = "\n".join(_render(jobs_table(JOBS, NAMES, "1d", 100_000), 100_000))
    header = narrow_lines[1].split()
    assert "causes" not in header and "node" not in header
    caption = " ".join(" ".join(narrow_lines[3 + len(JOBS) :]).split())
    assert "node" in caption and "causes" in caption and "gpu-node-007" not in narrow
    for column in ("cost", "verdict", "node", "causes", "peak-eq h"):
        assert column in wide
    assert "gpu-node-007.cluster.example" in wide and "input_cpu 37.5 h" in wide


def test_the_gpu_table_fits_too() -> None:
    gpus: list[tuple[GpuKey, Usage]] = [
        ((NO_CLUSTER, inst, str(i)), _usage({"held_idle": 0.5 * i}, 1.0, [inst], 1)) for inst in NODES for i in range(3)
    ]
    lines = _render(gpus_table(gpus, NAMES, "1d", 80), 80)
    assert all(len(line) <= 80 for line in lines) and len(lines) >= 3 + len(gpus)
    assert sum("gpu-node-008.cluster.example" in line for line in lines) == 3


def test_node_local_jobs_of_one_id_are_told_apart_at_80_columns_and_no_cause_is_cut_in_a_word() -> None:
    """Two containers with the same id on two nodes, a job id shared by two clusters: each row says which."""
    jobs = [
        (JobKey("a1b2c3d4e5f6", "10.0.0.7:9400"), _usage({"input_cpu": 2.0}, 4.0, ["10.0.0.7:9400"], 1)),
        (JobKey("a1b2c3d4e5f6", "10.0.0.8:9400"), _usage({"checkpoint": 1.0}, 4.0, ["10.0.0.8:9400"], 1)),
        (JobKey(SLUID, None, ("alpha",)), _usage({"held_idle": 1.0}, 4.0, ["10.0.0.7:9400"], 1)),
        (JobKey(SLUID, None, ("beta",)), _usage({"held_idle": 0.5}, 4.0, ["10.0.0.7:9400"], 1)),
    ]
    lines = _render(jobs_table(jobs, NAMES, "1d", 80), 80)
    assert all(len(line) <= 80 for line in lines), lines
    assert sum("a1b2c3d4e5f6 @ gpu-node-007 " in x for x in lines) == 1  # the node's host name, no domain
    assert sum("a1b2c3d4e5f6 @ gpu-node-008 " in x for x in lines) == 1
    assert sum(f"{SLUID} [alpha]" in x for x in lines) == 1 and sum(f"{SLUID} [beta]" in x for x in lines) == 1
    words = " ".join(lines).split()
    assert "input_cpu" in words and "checkpoint" in words and "held_idle" in words  # whole, never folded


def test_without_a_terminal_top_prints_every_column_as_tab_separated_values(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwarden.cluster.views import _console, _print

    console = _console()  # pytest's stdout is no terminal
    assert not console.is_terminal
    _print(console, jobs_table(JOBS, NAMES, "1d", console.width))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# Jobs by GPU-hours lost, last 1d"
    header = out[1].split("\t")
    assert header[:2] == ["job", "GPUs"] and {"node", "causes", "verdict", "cost"} <= set(header)
    rows = [line.split("\t") for line in out[2:] if line]
    assert len(rows) == len(JOBS) and all(len(r) == len(header) for r in rows)
    assert rows[0][0] == POD and rows[0][header.index("node")].startswith("gpu-node-007")


def test_details_give_the_effective_and_peak_equivalent_hours_where_known() -> None:
    key, u = JOBS[0]
    plain = "\n".join(_render(job_details(key, u, NAMES), 200))
    assert "96.0 held, 55.5 busy" in plain and "OFU" not in plain and "peers" not in plain
    known = Usage(**{**u.__dict__, "effective_hours": 40.0, "peak_equivalent_hours": 12.25, "peer_wait_hours": 8.0})
    text = "\n".join(_render(job_details(key, known, NAMES), 200))
    assert "55.5 busy, 8.00 of it waiting on peers, 40.0 with SM activity >= 50%" in text
    assert "12.2 at dense tensor peak (OFU)" in text
    row = [x for x in _render(jobs_table([(key, known)], NAMES, "1d", 100_000), 100_000) if POD in x]
    assert "12.2" in row[0]


def test_details_name_every_cause_the_cost_and_what_to_do_first() -> None:
    text = "\n".join(_render(job_details(*JOBS[0], NAMES), 80))
    assert POD in text and "gpu-node-007.cluster.example, gpu-node-008.cluster.example" in text
    assert "input_cpu 37.5 h, paused 2.00 h, lost 1.00 h" in text and "506.25 USD" in text
    assert "do first:" in text and "input_starved + throttled" in text


class _Prometheus:
    """Answers every query with nothing but the SLUIDs that carry ``slurm_job_id="4242"``: two jobs that reused
    the number in the range."""

    def query(self, promql: str, time: float | None = None) -> list:
        from gpuwarden.cluster.promapi import Sample

        if 'slurm_job_id="4242"' in promql and promql.startswith("group by (cluster, job_id)"):
            return [Sample({"job_id": SLUID}, 1.0), Sample({"job_id": "sEKNKTV3WPV501"}, 1.0)]
        return []

    def close(self) -> None:
        pass


def test_a_slurm_number_of_two_sluid_jobs_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from gpuwarden.cluster import views
    from gpuwarden.cluster.usage import Accounting

    prom = _Prometheus()
    monkeypatch.setattr(views, "_open", lambda args: (prom, Accounting(prom, "1h", "1m")))  # type: ignore[arg-type]
    args = argparse.Namespace(job="4242", instance=None, json=True, range="1h", step="1m", prometheus="http://p:9090")
    assert views.report(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and SLUID in err and "give the SLUID" in err
    args.job = "4243"  # no job and no SLUID carries the number: not found
    assert views.report(args) == 1 and "no job '4243'" in capsys.readouterr().err


def test_a_long_cgroup_id_is_cut_in_its_middle_at_80_columns_and_the_caption_says_so() -> None:
    """A 61-character cgroup job id at 80 columns: the row keeps its GPU-hours lost and its main cause (the id's head
    and tail around "..."), and the caption says ids were cut and where to see them whole; a pipe gets it whole."""
    long = "/system.slice/slurmstepd.scope/job_123456/step_0/user/task_0"
    jobs = [(JobKey(long, "10.0.0.7:9400"), _usage({"input_cpu": 2.0}, 4.0, ["10.0.0.7:9400"], 1)), *JOBS[1:]]
    table = jobs_table(jobs, NAMES, "1d", 80)
    lines = _render(table, 80)
    assert all(len(line) <= 80 for line in lines), lines
    header = lines[1].split()
    assert "lost" in header and "to" in header  # "lost h" and "lost to" kept
    [row] = [line for line in lines if "/system.slice/" in line]
    assert "..." in row and "input_cpu" in row and "2.00 (50%)" in row
    assert long not in "\n".join(lines)
    caption = " ".join(" ".join(lines[3 + len(jobs) :]).split())
    assert "job name(s) cut in the middle" in caption and "--json" in caption
    _, _, tsv = table.gpuwarden_tsv
    assert tsv[0][0].startswith(long)  # whole for a pipe
