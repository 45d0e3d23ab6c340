"""Shared fixtures: real recorded traces, snapshots replayed from them, and rendered scrapes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.exposition import Exposition
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource, demo_trace_path
from gpuwarden.snapshot import Held, NodeSnapshot

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
H100_SCENARIOS = ["idle", "compute_bound", "starved_dataloader", "starved_cpu_heavy", "h2d_pageable_copy", "held_idle"]


def trace(name: str) -> Path:
    """Path of a recorded trace under tests/data/traces."""
    return TRACES / f"{name}.jsonl.gz"


def replay_poller(path: Path, polls: int, analyzers: dict | None = None, timing: str = "recorded") -> Poller:
    """A Poller over a trace, advanced ``polls`` times synchronously (no thread), with the recorded spacing."""
    p = Poller(ReplaySource(path, timing=timing), 1.0, analyzers=analyzers)
    p.start(thread=False)
    for _ in range(polls - 1):
        p.poll_once()
    return p


def snapshot(path: Path, polls: int = 5) -> NodeSnapshot:
    """The snapshot after ``polls`` polls of a trace."""
    p = replay_poller(path, polls)
    assert p.snapshot is not None
    return p.snapshot


def render(snap: NodeSnapshot, enable: tuple[str, ...] = (), disable: tuple[str, ...] = ()) -> str:
    """The Prometheus text exposition of a snapshot."""
    exp = Exposition(Held(snap), select_collectors(enable, disable), CollectOptions())
    return exp.render().decode()


@pytest.fixture(scope="session")
def demo_path() -> Path:
    return demo_trace_path()


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (CI installs Debian's prometheus package)")
    return path
