"""The memory page against memory shapes of our own (tools/memory_shapes.py): every leak paged with the warning
its class is promised in docs/runbook.md, no warm-up, job start or plateau paged, through the real promtool."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml
from helpers import generated

REPO = Path(__file__).parent.parent
_spec = importlib.util.spec_from_file_location("memory_shapes", REPO / "tools" / "memory_shapes.py")
assert _spec is not None and _spec.loader is not None
shapes = importlib.util.module_from_spec(_spec)
sys.modules["memory_shapes"] = shapes  # dataclasses look their module up by name
_spec.loader.exec_module(shapes)


def test_each_leak_class_is_in_the_promtool_cases_with_a_promise() -> None:
    doc = yaml.safe_load(generated(REPO / "alerts" / "tests" / "memory.test.yml").read_text())
    names = [t["name"] for t in doc["tests"]]
    for prefix in ("linear-from-start", "linear-after-idle", "after-plateau", "staircase", "noisy", "accelerating"):
        assert any(n.startswith(prefix) for n in names), prefix
    # the issue-like ones: a per-epoch staircase, a fast leak after a plateau, noise; the slow warm-up among the calm
    assert any(n.startswith("staircase-60+4every8m: paged by minute 72 (8 min") for n in names), names
    assert any(n.startswith("after-plateau-82-full-12m: paged by minute 68 (4 min") for n in names), names
    assert "warmup-linear-30-93-in-25m," in names[-1] and names[-1].endswith("never paged")


def test_shapes_are_what_their_names_say() -> None:
    by = {s.name: s for s in shapes.leaks() + shapes.healthy()}
    assert by["staircase-60+4every8m"].full_at == 80 and by["staircase-60+4every8m"].level(8) == 64
    assert by["after-plateau-82-full-12m"].full_at == 72 and by["after-plateau-82-full-12m"].level(59) == 82
    warm = by["warmup-linear-30-93-in-25m"]
    assert warm.level(0) == 30 and warm.level(25) == pytest.approx(93) and warm.level(100) == pytest.approx(93)
    assert warm.full_at is None and not warm.leak
    noisy = by["noisy-45-full-55m-pm2"]
    assert max(abs(noisy.level(t) - (45 + t)) for t in range(55)) <= 2


def test_young_leaks_are_reported_apart_and_a_missed_leak_fails() -> None:
    leak = shapes.Shape("x", True, lambda t: 70 + t, 60, guarantee=5)  # full at 30: inside its job's warm-up
    old = shapes.Shape("y", True, lambda t: 60 + t, 60, job_start=-60, guarantee=5)
    lines, failures, _ = shapes.report([leak, old], {"x": [], "y": [38.0]})
    assert any("full inside its job's warm-up" in line for line in lines)
    assert failures == ["y: 2.0 min of warning, 5 promised"]
    calm = shapes.Shape("z", False, lambda t: 50, 60)
    assert shapes.report([calm], {"z": [12.0]})[1] == ["z: healthy, paged at [12.0]..."]


@pytest.mark.e2e
@pytest.mark.parametrize("interval", [60, 15])
def test_every_shape_keeps_its_promise_through_promtool(promtool: str, interval: int) -> None:
    """Every fixed shape, evaluated once a minute from samples every ``interval`` seconds: each leak paged with its
    promised warning (before full at least), no healthy shape paged in any minute. At 15 s the leaks of each
    class and the warm-ups run (the whole set at 60 s)."""
    pool = shapes.leaks() + shapes.healthy()
    if interval != 60:
        pool = [s for s in pool if s.name in shapes.REPRESENTATIVES or s.name.startswith("warmup-")]
    fired = shapes.run(pool, rules=generated(shapes.RULES), interval_s=interval)
    _, failures, leads = shapes.report(pool, fired)
    assert failures == []
    assert len(leads) == sum(s.leak and not shapes.apart(s) for s in pool)
