"""The drain plan (gpuwarden.cluster.drain): which Slurm nodes to drain, resume or refuse, from each node's GPUs in
the service tier and Slurm's own state; the reason's text; the command's flags."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

from gpuwarden.cluster.drain import REASON_CHARS, Action, SlurmNode, plan, reason_text


def _slurm(*nodes: tuple[str, str, str]) -> dict[str, SlurmNode]:
    return {n: SlurmNode(n, state, reason) for n, state, reason in nodes}


def test_a_node_with_a_gpu_in_service_is_drained_and_one_drained_already_is_left() -> None:
    slurm = _slurm(("a", "mixed", "none"), ("b", "drained", "maintenance by ops"), ("c", "idle", "none"))
    service = {"a": {"0": ["3 uncorrectable ECC error(s)"]}, "b": {"1": ["XID 79 (1x)"]}, "gone": {"0": ["lost"]}}
    assert plan(service, {"a", "b", "c"}, slurm, 1.0) == [
        Action("drain", "a", "gpuwarden: GPU 0: 3 uncorrectable ECC error(s)")
    ]


def test_only_its_own_drains_are_resumed_and_only_with_data_over_the_range() -> None:
    slurm = _slurm(("a", "drained", "gpuwarden: GPU 0: XID 79 (1x)"), ("b", "drained", "ops: fan"),
                   ("c", "drained*", "gpuwarden: GPU 2: lost"), ("d", "drained", "gpuwarden: GPU 1: lost"))  # fmt: skip
    actions = plan({"d": {"1": ["lost"]}}, {"a", "b", "d"}, slurm, 1.0)
    # a: clean and seen; b: someone else's drain; c: no data over the range; d: still needs service
    assert actions == [Action("resume", "a", "its GPUs were clean over the range")]


def test_drains_past_the_share_of_nodes_out_are_refused() -> None:
    """Ten nodes, one down already, 0.3 of them may be out: two more drains, the third refused."""
    slurm = _slurm(*[(f"n{i}", "down" if i == 9 else "idle", "none") for i in range(10)])
    service = {f"n{i}": {"0": ["lost"]} for i in range(4)}
    kinds = [(a.kind, a.node) for a in plan(service, set(slurm), slurm, 0.3)]
    assert kinds == [("drain", "n0"), ("drain", "n1"), ("refuse", "n2"), ("refuse", "n3")]


def test_the_reason_is_printable_ascii_and_bounded() -> None:
    text = reason_text({"0": ["a\nb\x1b[31m" + "x" * 300], "1": ["ok"]})
    assert text.startswith("gpuwarden: GPU 0: a?b?[31m") and len(text) == REASON_CHARS and text.endswith("...")
    assert all(" " <= ch <= "~" for ch in text)


def test_a_bad_ratio_is_a_usage_error_and_slurm_missing_is_one_line() -> None:
    run = [sys.executable, "-m", "gpuwarden", "drain", "--prometheus", "http://127.0.0.1:9", "--max-out-ratio", "2"]
    res = subprocess.run(run, capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert res.returncode == 2 and "--max-out-ratio" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(run[:-2], capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and res.stderr.startswith("gpuwarden drain:")
