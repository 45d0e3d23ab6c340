"""The node's name for GpuMissing: a container's id or a pod's name is refused on real GPUs, a node's name kept."""

from __future__ import annotations

import argparse

import pytest

from gpuwarden.cli import build_parser
from gpuwarden.commands.serve import _node_name_problem, load
from gpuwarden.config.nodename import unstable_name

CID = "3f1c2b9a8d7e" + "0" * 52
MOUNTINFO = (
    f"612 590 259:2 /var/lib/docker/containers/{CID}/hostname /etc/hostname rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
)


def test_docker_container_named_after_its_id_is_refused() -> None:
    why = unstable_name("3f1c2b9a8d7e", {}, MOUNTINFO)
    assert why is not None and "container id" in why and "GPUWARDEN_NODE_NAME" in why and "--uts=host" in why


def test_podman_container_named_after_its_id_is_refused() -> None:
    podman = MOUNTINFO.replace("/var/lib/docker/containers/", "/var/lib/containers/storage/overlay-containers/")
    podman = podman.replace(f"{CID}/hostname", f"{CID}/userdata/hostname")
    assert unstable_name("3F1C2B9A8D7E", {}, podman) is not None


def test_kubernetes_pod_name_is_refused() -> None:
    why = unstable_name("gpuwarden-x7k2p", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "")
    assert why is not None and "spec.nodeName" in why


def test_node_names_are_kept() -> None:
    assert unstable_name("gpu-node-17", {}, MOUNTINFO) is None  # --uts=host: the node's own name
    assert unstable_name("3f1c2b9a8d7e", {}, "") is None  # a host that happens to have a hex name, no container
    assert unstable_name("deadbeefcafe", {}, MOUNTINFO) is None  # hex, but not this container's id


def _cfg(*argv: str) -> argparse.Namespace:
    return build_parser("serve").parse_args(["serve", *argv])


def test_serve_needs_no_name_for_a_replay_or_a_configured_one() -> None:
    assert _node_name_problem(load(_cfg("--demo"))) is None
    assert _node_name_problem(load(_cfg("--replay", "x.jsonl"))) is None


@pytest.mark.e2e
def test_serve_in_a_pod_without_a_node_name_exits_2_with_one_line() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    env.pop("GPUWARDEN_NODE_NAME", None)
    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "serve", "--web.listen-address", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "GpuMissing could not work" in out.stderr and "spec.nodeName" in out.stderr


def test_a_configured_node_name_is_used_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv("GPUWARDEN_NODE_NAME", raising=False)
    assert _node_name_problem(load(_cfg())) is not None
    monkeypatch.setenv("GPUWARDEN_NODE_NAME", "gpu-node-17")
    assert _node_name_problem(load(_cfg())) is None
