"""``top --by``'s arithmetic (gpuwarden.cluster.owners): jobs added up by owner with the money of each figure at each
job's price, rows that add up to the fleet, and a CSV a spreadsheet opens without running a formula."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest
from helpers import REPO

from gpuwarden.cluster.owners import as_csv, as_json, by_owner
from gpuwarden.cluster.usage import JobKey, Usage


def _job(held: float, busy: float, lost: dict[str, float], price: float | None, gpus: int = 1) -> Usage:
    u = Usage(held_hours=held, busy_hours=busy, price=price, currency="USD" if price else "")
    u.lost_hours.update(lost)
    u.gpus = {("n1:9400", str(i)) for i in range(gpus)}
    return u


def test_jobs_add_up_by_owner_with_each_figure_priced_at_its_jobs_price() -> None:
    jobs = {JobKey("1"): _job(10, 6, {"input": 3, "held_idle": 1}, 4.0, gpus=8),
            JobKey("2"): _job(5, 5, {}, 0.35),
            JobKey("3"): _job(2, 0, {"held_idle": 2}, None),
            JobKey("4", "n2:9400"): _job(1, 0.5, {"input": 0.5}, 2.0)}  # fmt: skip
    owners = {JobKey("1"): "physics", JobKey("2"): "physics", JobKey("3"): "bio"}
    rows = by_owner(jobs, owners, "account")
    assert [r.owner for r in rows] == ["physics", None, "bio"]  # by lost money: 16, 1, then unpriced
    physics, nobody, bio = rows
    assert (physics.jobs, physics.gpus, physics.held_hours, physics.busy_hours) == (2, 9, 15, 11)
    assert physics.held_cost == pytest.approx(10 * 4.0 + 5 * 0.35) and physics.busy_cost == pytest.approx(24 + 1.75)
    assert physics.lost_cost == pytest.approx({"input": 12.0, "held_idle": 4.0} | {c: 0.0 for c in physics.lost_cost
                                               if c not in ("input", "held_idle")})  # fmt: skip
    assert (bio.held_cost, bio.lost_cost_total, bio.unpriced_held_hours) == (None, None, 2)  # no money made up
    assert nobody.owner is None and nobody.lost_cost_total == pytest.approx(1.0)
    # the rows add up to the fleet
    assert sum(r.held_hours for r in rows) == pytest.approx(sum(u.held_hours for u in jobs.values()))
    doc = as_json(physics)
    assert doc["lost_gpu_hours"] == 4 and doc["used_gpu_hours"] == 11 and doc["currency"] == "USD"
    by_job = by_owner(jobs, {}, "job")
    assert sorted(r.owner or "" for r in by_job) == ["1", "2", "3", "4 @ n2:9400"]


def test_the_csv_has_every_figure_and_no_cell_a_spreadsheet_runs() -> None:
    jobs = {JobKey("1"): _job(10, 6, {"input": 3}, 4.0), JobKey("2"): _job(1, 1, {}, None)}
    rows = by_owner(jobs, {JobKey("1"): '=HYPERLINK("http://x")', JobKey("2"): "+cmd"}, "user")
    table = list(csv.DictReader(io.StringIO(as_csv("user", rows))))
    assert [r["user"] for r in table] == ['\'=HYPERLINK("http://x")', "'+cmd"]
    first = table[0]
    assert float(first["held_gpu_hours"]) == 10 and float(first["lost_input_gpu_hours"]) == 3
    assert float(first["held_cost"]) == 40 and float(first["lost_input_cost"]) == 12 and first["currency"] == "USD"
    assert table[1]["held_cost"] == "" and table[1]["lost_cost"] == ""  # unpriced: empty, not 0


@pytest.mark.parametrize(("args", "message"), [
    (["--by", "account", "--quality"], "--suspects, --quality and --by are views of their own"),
    (["--format", "csv"], "--format csv writes the rows of --by"),
    (["--by", "team"], "invalid choice: 'team'"),
])  # fmt: skip
def test_a_view_asked_wrongly_is_a_usage_error(args: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, "-m", "gpuwarden", "top", "--prometheus", "http://127.0.0.1:9", *args],
                         capture_output=True, text=True, cwd=REPO, timeout=60, check=False)  # fmt: skip
    assert res.returncode == 2 and message in res.stderr.splitlines()[0] and "Traceback" not in res.stderr
