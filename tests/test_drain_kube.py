"""Health out to Kubernetes (gpuwarden.cluster.kube): a node's state as the API lists it, gpuwarden's taint and node
condition, and the writes against a stand-in API server that checks each against Kubernetes 1.30's Node schema
(tests/kube_apiserver.py); the command's textfile metrics, read back with prometheus_client's own parser."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kube_apiserver import ApiServer, node

from gpuwarden.cluster.drain import Action, plan
from gpuwarden.cluster.exclude import SERVICE_TAINT_KEY
from gpuwarden.cluster.kube import CONDITION, KubeApi, node_state, taint_value, with_condition, with_taint

DRAIN = Action("drain", "gpu-1", "gpuwarden: GPU 0: 3 uncorrectable ECC error(s); GPU 3: XID 79 (1x)")
RESUME = Action("resume", "gpu-1", "its GPUs were clean over the range")
NOW = datetime(2026, 11, 27, 2, 0, tzinfo=UTC)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _taints(obj: dict) -> list[dict]:
    return obj["spec"].get("taints", [])


def _condition(obj: dict) -> dict | None:
    return next((c for c in obj["status"]["conditions"] if c["type"] == CONDITION), None)


def test_a_node_is_out_when_cordoned_not_ready_or_tainted_by_gpuwarden_and_ours_only_by_its_taint() -> None:
    ours = {"key": SERVICE_TAINT_KEY, "value": "gpu0", "effect": "NoSchedule"}
    states = {
        n["metadata"]["name"]: node_state(n)
        for n in (
            node("up", taints=[GPU_TAINT]),
            node("cordoned", unschedulable=True),
            node("down", ready=False),
            node("tainted", taints=[GPU_TAINT, ours]),
        )  # fmt: skip
    }
    assert {k: (v.out, v.ours) for k, v in states.items() if v} == {
        "up": (False, False),  # a GPU node's own NoSchedule taint is how GPU pools work, not "out"
        "cordoned": (True, False),
        "down": (True, False),
        "tainted": (True, True),
    }
    assert node_state(node("Bad_Name")) is None and node_state({"metadata": "x"}) is None and node_state([]) is None


def test_the_taint_names_the_gpus_and_other_taints_and_conditions_are_kept() -> None:
    assert taint_value(DRAIN.reason) == "gpu0_3"
    obj = with_taint(node("gpu-1", taints=[GPU_TAINT]), DRAIN)
    assert _taints(obj) == [GPU_TAINT, {"key": SERVICE_TAINT_KEY, "value": "gpu0_3", "effect": "NoSchedule"}]
    assert _taints(with_taint(obj, RESUME)) == [GPU_TAINT]
    assert "taints" not in with_taint(with_taint(node("gpu-1"), DRAIN), RESUME)["spec"]
    obj = with_condition(node("gpu-1"), DRAIN, NOW)
    assert [c["type"] for c in obj["status"]["conditions"]] == ["Ready", CONDITION]
    set_at = _condition(obj)
    assert set_at is not None and set_at["status"] == "True" and set_at["message"] == DRAIN.reason
    later = datetime(2026, 11, 27, 3, 0, tzinfo=UTC)
    again = _condition(with_condition(obj, DRAIN, later))  # same status: the transition time stays
    assert again is not None and again["lastTransitionTime"] == "2026-11-27T02:00:00Z"
    assert again["lastHeartbeatTime"] == "2026-11-27T03:00:00Z"
    cleared = _condition(with_condition(obj, RESUME, later))
    assert cleared is not None and cleared["status"] == "False"
    assert cleared["lastTransitionTime"] == "2026-11-27T03:00:00Z"


def test_drain_and_resume_write_what_the_api_schema_accepts_and_keep_what_others_set(tmp_path) -> None:  # noqa: ANN001
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with ApiServer([node("gpu-1", taints=[GPU_TAINT]), node("gpu-2")], token="s3cret") as api:
        kube = KubeApi(api.url, str(token))
        try:
            nodes = kube.nodes()
            assert set(nodes) == {"gpu-1", "gpu-2"} and not nodes["gpu-1"].out
            assert kube.apply(DRAIN, NOW) is None
            stored = api.nodes["gpu-1"]
            assert _taints(stored) == [GPU_TAINT, {"key": SERVICE_TAINT_KEY, "value": "gpu0_3", "effect": "NoSchedule"}]
            cond = _condition(stored)
            assert cond is not None and (cond["status"], cond["reason"]) == ("True", "GpuwardenService")
            assert stored["status"]["conditions"][0]["type"] == "Ready" and stored["spec"]["podCIDR"] == "10.0.0.0/24"
            assert kube.nodes()["gpu-1"].ours and kube.nodes()["gpu-1"].out
            assert kube.apply(RESUME, NOW) is None
            stored = api.nodes["gpu-1"]
            cond = _condition(stored)
            assert _taints(stored) == [GPU_TAINT] and cond is not None and cond["status"] == "False"
            assert not kube.nodes()["gpu-1"].out
            puts = [path for method, path, _ in api.requests if method == "PUT"]
            assert puts == ["/api/v1/nodes/gpu-1", "/api/v1/nodes/gpu-1/status"] * 2
            assert api.rejected == []
        finally:
            kube.close()


def test_a_node_changed_between_read_and_write_is_read_again() -> None:
    with ApiServer([node("gpu-1")]) as api:
        kube = KubeApi(api.url)
        api.conflicts = 2  # the kubelet wrote its status twice in between
        assert kube.apply(DRAIN, NOW) is None
        assert [m for m, _, _ in api.requests].count("PUT") == 4 and _condition(api.nodes["gpu-1"]) is not None
        api.conflicts = 99
        error = kube.apply(RESUME, NOW)
        assert error is not None and "kept changing" in error
        kube.close()


def test_refusals_of_the_api_are_one_line_errors_never_a_raise(tmp_path) -> None:  # noqa: ANN001
    with ApiServer([node("gpu-1")], token="right") as api:
        wrong = tmp_path / "token"
        wrong.write_text("wrong")
        kube = KubeApi(api.url, str(wrong))
        with pytest.raises(RuntimeError, match="401"):
            kube.nodes()
        assert "401" in (kube.apply(DRAIN, NOW) or "")
        kube.close()
        api.token = None
        kube = KubeApi(api.url, None)
        gone = kube.apply(Action("drain", "gpu-9", DRAIN.reason), NOW)
        assert gone is not None and gone.startswith("GET /api/v1/nodes/gpu-9: 404") and "\n" not in gone
        kube.close()
    dead = KubeApi(api.url)
    assert dead.apply(DRAIN, NOW)  # nothing listens: the error, one line
    dead.close()


def test_a_write_the_schema_rejects_is_reported_with_the_api_servers_reason() -> None:
    """The stand-in is a real check: an unknown field or a bad taint value answers 422, as the API server does."""
    bad = node("gpu-1", taints=[{"key": SERVICE_TAINT_KEY, "value": "has space", "effect": "NoSchedule"}])
    bad["spec"]["gpuwarden"] = True
    with ApiServer([node("gpu-1")]) as api:
        import httpx

        r = httpx.put(f"{api.url}/api/v1/nodes/gpu-1", json=bad)
        message = r.json()["message"]
        assert r.status_code == 422 and "gpuwarden" in message and "not a label value" in message


def test_the_plan_over_kubernetes_nodes_caps_the_share_out_and_resumes_only_its_own() -> None:
    ours = {"key": SERVICE_TAINT_KEY, "value": "gpu0", "effect": "NoSchedule"}
    listed = [node("a"), node("b"), node("c", unschedulable=True), node("d", taints=[ours]),
              node("e", unschedulable=True)]  # fmt: skip
    nodes = {n.name: n for n in map(node_state, listed) if n}
    actions = plan({"a": {"0": ["lost"]}, "b": {"1": ["lost"]}}, {"a", "b", "c", "d", "e"}, nodes, 0.8)
    # 3 of 5 out already, 0.8 lets one more; c and e were cordoned by someone else: never resumed
    assert [(a.kind, a.node) for a in actions] == [("drain", "a"), ("refuse", "b"), ("resume", "d")]
