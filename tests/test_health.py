"""``gpuwarden check``: each GPU's readiness for the next job, on recorded polls (and their derived health faults),
with the exit codes a prolog reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.cli import build_parser
from gpuwarden.health import assess, worst
from gpuwarden.model import FabricReading, GpuReading, GpuStatic, NodeStatic, PollResult, ProcessReading

TRACES = Path(__file__).parent / "data" / "traces"


def cli(argv: list[str]) -> int:
    args = build_parser("check").parse_args(["check", *argv])
    return int(args.run(args))


@pytest.mark.parametrize(
    ("trace", "extra", "code", "level", "reasons"),
    [
        ("h100-idle", [], 0, "PASS", []),
        ("h100-compute_bound", [], 0, "WARN", ["process(es) hold the GPU"]),
        ("h100-compute_bound", ["--strict"], 1, "WARN", ["process(es) hold the GPU"]),
        ("derived-h100-health", [], 2, "CRITICAL", ["uncorrectable ECC", "slowdown at 89", "row remap is pending"]),
        ("derived-8gpu-lost", ["--gpus", "3"], 2, "CRITICAL", ["the GPU cannot be read"]),
        ("derived-8gpu-lost", ["--gpus", "0,1"], 0, "WARN", ["process(es) hold the GPU"]),
        ("h200x2-nvlink", [], 0, "PASS", []),  # 18 active links each, fabric completed
    ],
)
def test_recorded_polls_get_their_level_and_exit_code(
    trace: str, extra: list[str], code: int, level: str, reasons: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(TRACES / f"{trace}.jsonl.gz")
    assert cli(["--replay", path, "--format", "json", *extra]) == code
    doc = json.loads(capsys.readouterr().out)
    assert doc["level"] == level
    said = " ".join(f["reason"] for g in doc["gpus"] for f in g["findings"])
    assert all(r in said for r in reasons), said
    if "--gpus" in extra:
        assert [g["gpu"] for g in doc["gpus"]] == [int(i) for i in extra[1].split(",")]
    assert cli(["--replay", path, *extra]) == code
    text = capsys.readouterr().out
    assert text.rstrip().endswith(level) and all(r in " ".join(text.split()) for r in reasons)


def _node(**gpu: object) -> tuple[NodeStatic, PollResult]:
    static = NodeStatic(
        hostname="n",
        gpus=[
            GpuStatic(
                index=0,
                uuid="GPU-0",
                name="H100",
                pcie_max_width=16,
                nvlink_link_count=4,
                temperature_thresholds_celsius={"slowdown": 87.0, "shutdown": 92.0, "memory_max": 95.0},
            )
        ],
    )
    reading = GpuReading(index=0, uuid="GPU-0", timestamp=0.0, processes=[], **gpu)  # type: ignore[arg-type]
    return static, PollResult(timestamp=0.0, duration_seconds=0.0, gpus=[reading])


@pytest.mark.parametrize(
    ("gpu", "level", "reason"),
    [
        ({"recovery_action": 2}, "CRITICAL", "the driver asks for recovery action 2 (1 a GPU reset, 2 a node reboot"),
        ({"remapped_rows": {"failure": 1, "pending": 0}}, "CRITICAL", "a row remap failed"),
        ({"temperature_gpu_celsius": 88.0}, "CRITICAL", "GPU at 88 °C, its slowdown at 87 °C"),
        ({"temperature_gpu_celsius": 82.0}, "CRITICAL", "GPU at 82 °C, its slowdown at 87 °C"),  # the page's margin
        ({"temperature_gpu_celsius": 81.9}, "PASS", ""),
        ({"temperature_gpu_celsius": 40.0, "temperature_memory_celsius": 91.0}, "CRITICAL", "HBM at 91 °C"),
        ({"clock_event_reasons": 0x8}, "WARN", "clock event hw_slowdown holds the clocks down"),
        ({"clock_event_reasons": 0x1}, "PASS", ""),  # gpu_idle: expected
        ({"pcie_width": 8, "pcie_generation": 1}, "WARN", "PCIe link at x8 of x16"),
        ({"pcie_width": 16, "pcie_generation": 1}, "PASS", ""),  # the generation drops at idle
        ({"memory_used_bytes": 20 << 30}, "WARN", "20.0 GiB used with no process visible"),
        ({"up": False, "error": "gpu_is_lost"}, "CRITICAL", "cannot be read"),
        ({"fabric": FabricReading(state="in_progress", status="success")}, "CRITICAL", "state in_progress"),
        ({"fabric": FabricReading(state="not_started", status="not_ready")}, "CRITICAL", "state not_started"),
        (
            {
                "fabric": FabricReading(
                    state="completed", status="success", health={"route_unhealthy": True, "degraded_bandwidth": False}
                )
            },
            "WARN",
            "fabric reports route_unhealthy",
        ),  # fmt: skip
        ({"fabric": FabricReading(state="completed", status="success")}, "PASS", ""),
        ({"nvlink_link_up": {"0": 1, "1": 0, "2": 1, "3": 0}}, "WARN", "link(s) 1, 3 inactive while others"),
        ({"nvlink_link_up": {"0": 0, "1": 0}}, "PASS", ""),  # no link active: NVLink not in use here
    ],
)
def test_each_rule(gpu: dict[str, object], level: str, reason: str) -> None:
    static, poll = _node(**gpu)
    (check,) = assess(static, poll)
    assert check.level == level and worst([check]) == level
    assert reason in " ".join(f.reason for f in check.findings)


def test_hostile_process_names_are_shown_as_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from gpuwarden.commands.check import _print

    static, poll = _node()
    evil = ProcessReading(pid=7, name="\x1b]0;owned\x07[red]x\x1b[2J", gpu_memory_bytes=1 << 30)
    poll = poll.model_copy(update={"gpus": [poll.gpus[0].model_copy(update={"processes": [evil]})]})
    checks = assess(static, poll)
    _print(checks, worst(checks), 0.1)
    out = capsys.readouterr().out
    assert "\x1b]0;" not in out and "\x07" not in out and "\x1b[2J" not in out and "[red]x" in out


def test_without_a_driver_it_is_one_line_and_exit_3(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    from gpuwarden.source import SourceError

    def no_nvml(self: object) -> NodeStatic:
        raise SourceError("NVML unavailable: the NVML library (libnvidia-ml.so.1) was not found")

    monkeypatch.setattr("gpuwarden.nvml.NvmlSource.open", no_nvml)
    assert cli([]) == 3
    err = capsys.readouterr().err
    assert err.startswith("gpuwarden: cannot check the GPUs: NVML unavailable") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "needle"), [(["--gpus", "0,x"], "'x' is not a GPU index"), (["--poll", "999"], "no such poll")]
)
def test_bad_flags_are_one_line_and_exit_64_not_critical(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["--replay", str(TRACES / "h100-idle.jsonl.gz"), *argv]) == 64
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--strcit"], ["--format", "yaml"], ["--gpus"]])
def test_a_typo_in_the_command_line_exits_64_not_2_so_a_prolog_drains_no_node_over_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwarden.cli import main

    assert main(["check", "--replay", str(TRACES / "h100-idle.jsonl.gz"), *argv]) == 64
    err = capsys.readouterr().err
    assert "gpuwarden check: error:" in err and "(gpuwarden check --help for every option)" in err
    assert argv != ["--strcit"] or "--strcit: did you mean --strict?" in err
    with pytest.raises(SystemExit) as exited:  # other commands keep argparse's 2
        main(["top", "--no-such-flag"])
    assert exited.value.code == 2


def test_every_alert_is_a_health_rule_or_says_why_one_read_cannot_judge_it() -> None:
    """A new alert in the rules file fails here until it is a health rule (gpuwarden.health.rules: check reads it) or
    gpuwarden.health.NOT_READ says why one read cannot judge it; a rule that is no alert says why."""
    import yaml

    from gpuwarden import health

    rules = yaml.safe_load((Path(__file__).parent.parent / "alerts" / "gpuwarden.rules.yml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    declared = [r.name for r in health.RULES if r.alert]
    assert set(declared) <= set(alerts), "health rules the rules file lacks: run python3 tools/generate.py"
    assert set(alerts) - set(declared) - set(health.NOT_READ) == set(), "say in NOT_READ why check cannot read them"
    assert set(health.NOT_READ) & set(declared) == set() and set(health.NOT_READ) <= set(alerts)
    assert all(r.why for r in health.RULES if not r.alert)
    assert len({r.name for r in health.RULES}) == len(health.RULES)
