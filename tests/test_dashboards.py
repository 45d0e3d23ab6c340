"""Lint of the Grafana dashboards: generated, classic JSON model, units, variables, rates, links."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
BOARDS = sorted((REPO / "dashboards").glob("*.json"))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_three_dashboards_linked_together() -> None:
    uids = {load(p)["uid"] for p in BOARDS}
    assert uids == {"gpuwarden-fleet", "gpuwarden-node", "gpuwarden-job"}
    for p in BOARDS:
        urls = {link["url"] for link in load(p)["links"]}
        assert {f"/d/{u}" for u in uids} <= urls, p.name


def test_committed_json_is_what_the_generator_writes(tmp_path: Path) -> None:
    before = {p.name: p.read_text() for p in BOARDS}
    subprocess.run([sys.executable, str(REPO / "dashboards" / "generate.py")], check=True, timeout=60)
    assert {p.name: p.read_text() for p in BOARDS} == before, "run python3 dashboards/generate.py and commit"


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_dashboard_lint(path: Path) -> None:
    d = load(path)
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and "job" in variables
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["type"] not in ("graph", "singlestat", "table-old"), f"{p['title']}: Angular panel"
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
        for t in p["targets"]:
            expr = t["expr"]
            for rng in re.findall(r"\[([^\]]+)\]", expr):
                assert rng in ("$__rate_interval", "$__range"), f"{p['title']}: fixed range [{rng}]"
            assert 'job=~"$job"' in expr or "job_id:" in expr, f"{p['title']}: not filtered by $job"
