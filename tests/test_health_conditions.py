"""The health rules' conditions, read two ways, agree: gpuwarden.health's evaluation over one render's samples (what
``gpuwarden check`` judges) and Prometheus's own engine (promtool test rules) on the same samples, for every rule,
on recorded polls and on readings at, just below and just above each threshold."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuwarden.health import RULES, samples
from gpuwarden.health.conditions import Condition, Series, number, shipped
from gpuwarden.model import FabricReading, GpuReading, GpuStatic, NodeStatic, PollResult, ProcessReading
from gpuwarden.trace import read_trace

TRACES = Path(__file__).parent / "data" / "traces"
RECORDED = ("h100-idle", "h100-compute_bound", "derived-h100-health", "derived-8gpu-lost", "h200x2-nvlink")
#: One GPU's readings at and around each rule's threshold (the static below: slowdown 87 °C, HBM 95 °C, x16).
EDGES: list[dict[str, object]] = [
    {"temperature_gpu_celsius": 82.0},
    {"temperature_gpu_celsius": 81.9},
    {"temperature_gpu_celsius": 90.0, "temperature_memory_celsius": 90.0},
    {"temperature_memory_celsius": 89.9},
    {"recovery_action": 1},
    {"recovery_action": 0},
    {"remapped_rows": {"failure": 1, "pending": 1}},
    {"remapped_rows": {"failure": 0, "pending": 0}},
    {"ecc_errors_total": {"uncorrected_volatile": 2, "corrected_volatile": 9}},
    {"ecc_errors_total": {"uncorrected_volatile": 0, "uncorrected_aggregate": 4}},
    {"clock_event_reasons": 0x8 | 0x80},  # hw_slowdown and hw_power_brake_slowdown
    {"clock_event_reasons": 0x20 | 0x4},  # sw_thermal_slowdown, sw_power_cap: not hardware
    {"pcie_width": 8},
    {"pcie_width": 16},
    {"memory_used_bytes": (1 << 30) + 1, "processes": []},
    {"memory_used_bytes": 1 << 30, "processes": []},
    {"memory_used_bytes": 40 << 30, "processes": [ProcessReading(pid=3, name="python", gpu_memory_bytes=40 << 30)]},
    {"processes": [ProcessReading(pid=4, name="x")]},  # no memory known
    {"fabric": FabricReading(state="in_progress", status="success")},
    {
        "fabric": FabricReading(
            state="completed", status="success", health={"route_unhealthy": True, "degraded_bandwidth": True}
        )
    },  # fmt: skip
    {"nvlink_link_up": {"0": 1, "1": 0, "2": 1, "3": 0}},
    {"nvlink_link_up": {"0": 0, "1": 0, "2": 0, "3": 0}},
    {"up": False, "error": "gpu_is_lost"},
]


def _edge(gpu: dict[str, object]) -> tuple[NodeStatic, PollResult]:
    static = NodeStatic(hostname="n", gpus=[GpuStatic(
        index=0, uuid="GPU-0", name="H100", pcie_max_width=16, nvlink_link_count=4,
        temperature_thresholds_celsius={"slowdown": 87.0, "shutdown": 92.0, "memory_max": 95.0})])  # fmt: skip
    reading = GpuReading(index=0, uuid="GPU-0", timestamp=0.0, **gpu)  # type: ignore[arg-type]
    return static, PollResult(timestamp=0.0, duration_seconds=0.0, gpus=[reading])


def _cases() -> list[tuple[NodeStatic, PollResult]]:
    out = [_edge(gpu) for gpu in EDGES]
    for name in RECORDED:
        header, polls = read_trace(TRACES / f"{name}.jsonl.gz")
        out += [(header.node, polls[0]), (header.node, polls[-1])]
    return out


def _selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def test_check_and_prometheus_judge_every_rule_alike(promtool: str, tmp_path: Path) -> None:
    read = [s for rule in RULES for s in rule.when.series_read()]
    series: dict[str, float] = {}
    expected: dict[str, list[dict[str, object]]] = {rule.name: [] for rule in RULES}
    for i, (static, poll) in enumerate(_cases()):
        every = list(samples(static, poll))
        for s in every:
            if any(r.selects(s) for r in read):
                series[_selector(s.name, {**s.labels, "instance": f"case{i}"})] = s.value
        for rule in RULES:
            for found in rule.when.matches(every, shipped).values():
                expected[rule.name] += [
                    {"labels": _selector(rule.when.series.metric, {**m.labels, "instance": f"case{i}"}),
                     "value": m.value} for m in found]  # fmt: skip
    assert all(expected.values()), [name for name, found in expected.items() if not found]  # each rule met somewhere
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": k, "values": repr(v)} for k, v in series.items()],
            "promql_expr_test": [
                {"expr": rule.when.promql(lambda m, x: f"{m}{{{x}}}", lambda p: number(shipped(p))), "eval_time": "0m",
                 "exp_samples": expected[rule.name]} for rule in RULES],
        }],
    }  # fmt: skip
    (tmp_path / "conditions.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", "conditions.test.yml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("condition", "sample_labels", "value", "met"),
    [
        (Condition(Series("m", (("state", "!=", "completed"),)), "==", 1), {"state": "completed"}, 1.0, False),
        (Condition(Series("m", (("state", "!=", "completed"),)), "==", 1), {"state": "in_progress"}, 1.0, True),
        (Condition(Series("m", (("reason", "=~", "hw_slowdown"),)), "==", 1), {"reason": "hw_slowdown_x"}, 1.0, False),
        (Condition(Series("m", (("reason", "!~", "a|b"),)), ">", 0), {}, 1.0, True),  # a missing label reads ""
        (Condition(Series("m"), ">=", "hot_margin_celsius"), {}, shipped("hot_margin_celsius"), True),
    ],
)
def test_matchers_follow_promql(condition: Condition, sample_labels: dict[str, str], value: float, met: bool) -> None:
    from prometheus_client.samples import Sample

    sample = Sample("m", {"gpu": "0", "uuid": "GPU-0", **sample_labels}, value, None, None)
    assert bool(condition.matches([sample], shipped)) is met


def test_a_bad_operator_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="comparison '=>'"):
        Condition(Series("m"), "=>", 1)
    with pytest.raises(ValueError, match="label matcher operator '=='"):
        Series("m", (("a", "==", "b"),))
