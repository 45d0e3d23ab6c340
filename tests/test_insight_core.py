"""A scrape reads the core of a poll's insight (``InsightCore``: the verdicts decided, no Diagnosis model made); the
JSON routes read the whole result, whose diagnoses are made from the same verdicts. And the shortcuts of the
64-GPU result give what the plain computations give: the margins' reuse test, a moved window, a window's
activity, a job's peers."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from conftest import trace

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.config import Config
from gpuwarden.daemon import build_analyzers
from gpuwarden.exposition import Exposition
from gpuwarden.insight import diagnosis as dg
from gpuwarden.insight import margins
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.insight.gpu_window import GpuWindow
from gpuwarden.insight.vocabulary.result import InsightCore, insight_core, snapshot_core, snapshot_insight
from gpuwarden.insight.vocabulary.verdicts import Diagnosis
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource
from gpuwarden.trace import read_trace

RECORDINGS = ["h200x2-ddp_straggler", "h100-starved_dataloader", "h100-compute_bound", "derived-8gpu-lost"]


def _poller(name: str) -> Poller:
    p = Poller(ReplaySource(trace(name), timing="recorded"), 1.0, analyzers=build_analyzers(Config()))
    p.start(thread=False)
    return p


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_scrape_makes_no_diagnosis_model_and_exports_the_findings_of_the_whole_result(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[int] = []
    real = dg.Decided.diagnosis

    def counted(self: dg.Decided) -> Diagnosis:
        made.append(1)
        return real(self)

    monkeypatch.setattr(dg.Decided, "diagnosis", counted)
    poller = _poller(name)
    expo = Exposition(poller, select_collectors(), CollectOptions())
    verdicts = 0
    for _ in range(40):
        poller.poll_once()
        snap = poller.snapshot
        assert snap is not None
        text = expo.render(snap).decode()
        assert made == []  # the scrape read the core only
        res = snapshot_insight(snap)  # what /api/v1/diagnosis reads
        assert res is not None
        for g in res.gpus:
            for reason in ("waiting_on_peers", "input_starved", "compute_bound", "gpu_lost", "throttled"):
                line = f'gpu_diagnosis{{gpu="{g.gpu}",reason="{reason}",uuid="{g.uuid}"}} '
                if g.diagnosis is None:
                    assert line not in text
                else:
                    assert (line + "1.0" in text) == (reason in g.diagnosis.findings)  # a reason that does not
                    assert line + "0.0" not in text  # hold has no series
        verdicts += sum(g.diagnosis is not None for g in res.gpus)
        assert len(made) == sum(g.diagnosis is not None for g in res.gpus)  # made once, when first read
        assert snapshot_insight(snap) is res
        made.clear()
    assert verdicts > 0


def test_the_core_of_a_whole_result_is_that_result() -> None:
    header, polls = read_trace(trace("h200x2-ddp_straggler"))
    analyzer = InsightAnalyzer(window_seconds=12.0, diagnosis_seconds=5.0)
    res = [analyzer(p, header.node) for p in polls][-1]
    core = insight_core(res)
    assert isinstance(core, InsightCore) and core.base is res and core.result() is res
    assert core.findings == [tuple(g.diagnosis.findings) if g.diagnosis else None for g in res.gpus]
    assert any(f is not None for f in core.findings)
    assert insight_core(None) is None and insight_core("insight") is None


def test_the_core_is_built_once_whoever_reads_first() -> None:
    poller = _poller("h100-compute_bound")
    for _ in range(10):
        poller.poll_once()
    snap = poller.snapshot
    assert snap is not None
    core = snapshot_core(snap)
    assert core is not None and snapshot_core(snap) is core
    whole = snapshot_insight(snap)
    assert whole is core.result() and [g.model_copy(update={"diagnosis": None}) for g in whole.gpus] == core.base.gpus


def _old_close(a: list[float | None], b: list[float | None]) -> bool:
    """The reuse test as first written: max() per value."""
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            if x is not y:
                return False
        elif abs(x - y) > max(margins.REUSE * max(abs(x), abs(y)), margins.REUSE_FLOOR):
            return False
    return True


def test_the_reuse_test_is_the_relative_and_absolute_margin_value_by_value() -> None:
    rnd = random.Random(7)
    agree = {True: 0, False: 0}
    for _ in range(20_000):
        n = rnd.randint(1, 6)
        a = [rnd.choice([None, 0.0, -1.0, 1.0, 1e-4, 2.5e9]) or rnd.uniform(-2, 2) for _ in range(n)]
        b = [
            x if x is None or rnd.random() < 0.2 else x * (1 + rnd.uniform(-0.05, 0.05)) + rnd.uniform(-2e-3, 2e-3)
            for x in a
        ]
        if rnd.random() < 0.05:
            b[rnd.randrange(n)] = None
        got = margins._close(*([margins._UNKNOWN if x is None else x for x in v] for v in (a, b)))
        assert got == _old_close(a, b), (a, b)
        agree[got] += 1
    assert agree[True] > 1000 and agree[False] > 1000  # both answers are exercised


def test_a_moved_window_is_the_window_with_one_field_replaced() -> None:
    from gpuwarden.insight.gpu_window import replaced

    w = GpuWindow(index=3, uuid="GPU-x", seconds=60.0, states={"busy": 30.0, "starved": 30.0}, held=True, util=0.5)
    moved = replaced(w, "util", 0.425)
    assert moved == dataclasses.replace(w, util=0.425) and w.util == 0.5 and type(moved) is GpuWindow
    with pytest.raises(dataclasses.FrozenInstanceError):
        moved.util = 0.1  # type: ignore[misc]


def test_a_windows_activity_is_what_its_full_window_says() -> None:
    header, polls = read_trace(trace("h200x2-ddp_straggler"))
    analyzer = InsightAnalyzer(window_seconds=12.0, diagnosis_seconds=5.0)
    seen = 0
    for p in polls:
        analyzer(p, header.node)
        for state in analyzer._gpus.values():
            captured = state.node.capture()
            full, slim = captured.window(state.index, "GPU-x", None), captured.activity(state.index)
            assert (slim.index, slim.states, slim.util, slim.sm) == (full.index, full.states, full.util, full.sm)
            seen += full.sm is not None
    assert seen > 0


def test_a_window_made_from_its_values_is_the_dataclass_made_by_its_init() -> None:
    from gpuwarden.insight.gpu_window import Health, window_of

    values: dict[str, Any] = {"index": 1, "uuid": "GPU-y", "seconds": 30.0, "states": {"busy": 30.0}, "held": False}
    values["sm"] = 0.25
    w = window_of(values)
    assert w == GpuWindow(**values) and w.health == Health() and w.health is not window_of(values).health
    assert dataclasses.replace(w, sm=0.5) == GpuWindow(**{**values, "sm": 0.5})
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.sm = 0.1  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'smm'"):
        window_of({**values, "smm": 0.1})
    with pytest.raises(TypeError, match="needs field 'held'"):
        window_of({k: v for k, v in values.items() if k != "held"})


def test_the_waiters_of_a_gpu_are_the_peers_whose_straggler_it_is() -> None:
    from gpuwarden.insight.peers import waiters, waits_on

    rnd = random.Random(11)

    def gpu(i: int) -> GpuWindow:
        util = rnd.choice([None, 0.0, rnd.random(), 0.95, 1.0])
        sm = rnd.choice([None, 0.0, rnd.random(), rnd.random() * 0.2])
        return GpuWindow(index=i, uuid=f"GPU-{i}", seconds=60.0, states={}, held=True, util=util, sm=sm)

    found = 0
    for _ in range(3000):
        ws = [gpu(i) for i in range(rnd.randint(2, 6))]
        w, peers = ws[0], ws[1:]
        expected = [p for p in peers if waits_on(p, [w]) is w]
        assert waiters(w, peers) == expected
        found += len(expected)
    assert found > 500


def test_the_alternatives_are_the_verdicts_of_every_moved_window_judged_afresh() -> None:
    """The alternatives reuse the peer test of the window they move (``Facts.lag``) for moves of fields it does not
    read: the verdicts are those of each moved window judged from nothing."""
    from gpuwarden.insight.reasons import verdict_of

    def reference(w: GpuWindow, peers: list[GpuWindow], verdict: str) -> list[str]:
        out: list[str] = []
        for _, moved in margins._moved(w):
            name = verdict_of(moved, peers)
            if name != verdict and name not in out and name not in ("free", "starting"):
                out.append(name)
        return out

    rnd = random.Random(5)

    def gpu(i: int) -> GpuWindow:
        busy = rnd.uniform(0, 60)
        return GpuWindow(
            index=i, uuid=f"GPU-{i}", seconds=60.0, held=True,
            states={"busy": busy, "starved": rnd.uniform(0, 60 - busy), "paused": 0.0},
            util=rnd.random(), sm=rnd.choice([None, rnd.random(), rnd.random() * 0.3]),
            job_cpu_cores=rnd.choice([None, rnd.uniform(0, 8)]), pcie_rx=rnd.choice([None, rnd.uniform(0, 2e10)]),
            pcie_tx=rnd.choice([None, rnd.uniform(0, 2e10)]), dram=rnd.choice([None, rnd.random()]),
            voluntary_switches_per_second=rnd.choice([None, rnd.uniform(0, 500)]),
        )  # fmt: skip

    seen: set[str] = set()
    for _ in range(400):
        ws = [gpu(i) for i in range(rnd.randint(1, 5))]
        w, peers = ws[0], ws[1:]
        verdict = verdict_of(w, peers)
        got = margins.alternatives(w, peers, verdict)
        assert got == reference(w, peers, verdict)
        seen.update(got)
    assert "waiting_on_peers" in seen and len(seen) >= 4


def test_every_number_a_verdict_rule_reads_is_moved_by_the_margins_or_said_not_to_be() -> None:
    """Every verdict rule run on 300 random windows whose attribute reads are recorded: each number of GpuWindow a
    rule reads is in margins.MEASURED (moved by the margin) or margins.NOT_MOVED, and each of MEASURED is read."""
    import dataclasses

    from gpuwarden.insight.reasons import VERDICT_RULES
    from gpuwarden.insight.rules import Facts

    numbers = {f.name for f in dataclasses.fields(GpuWindow) if str(f.type) in ("float", "float | None")}
    seen: set[str] = set()

    class Reads:
        def __init__(self, w: GpuWindow) -> None:
            self._w = w

        def __getattr__(self, name: str) -> object:
            seen.add(name)
            return getattr(self._w, name)

    rnd = random.Random(1)
    for _ in range(300):
        values: dict[str, Any] = {n: rnd.choice([None, 0.0, rnd.random(), rnd.uniform(0, 1e10)]) for n in numbers}
        values.update(throttle_fraction=rnd.random(), severe_throttle_fraction=rnd.random(), seconds=60.0)
        states = {s: rnd.uniform(0, 20) for s in ("busy", "starved", "paused", "held_idle")}
        w = GpuWindow(index=0, uuid="GPU-0", held=rnd.random() < 0.8, states=states, **values)
        peer = GpuWindow(index=1, uuid="GPU-1", seconds=60.0, held=True, states={"busy": 30.0}, util=rnd.random(),
                         sm=rnd.random())  # fmt: skip
        facts = Facts(Reads(w), [peer])  # type: ignore[arg-type]
        for _, rule in VERDICT_RULES:
            if rule.when is not None:
                rule.when(facts)
    read = seen & numbers
    assert read - set(margins.MEASURED) - margins.NOT_MOVED == set(), "add them to MEASURED or NOT_MOVED"
    assert set(margins.MEASURED) - read == set(), "MEASURED names numbers no rule reads"
