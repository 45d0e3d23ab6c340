"""``gpuwarden drain --scheduler dra``: the plan per GPU (gpuwarden.cluster.dra.plan) and its writes, against the
stand-in API server (tests/kube_apiserver.py) that checks each DeviceTaintRule against Kubernetes 1.37's published
schema for resource.k8s.io/v1 (1.36's for v1beta2) and the API server's own validation of its fields."""

from __future__ import annotations

import pytest
from kube_apiserver import ApiServer, resource_slice

from gpuwarden.cluster.bounds import Deadline
from gpuwarden.cluster.dra import (
    Device,
    DeviceAction,
    DraApi,
    GpuNeed,
    TaintRule,
    plan,
    rule_name,
    slice_devices,
    taint_rule,
)

UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]
OTHER = [f"GPU-1000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]


def _devices(node: str = "n1", uuids: list[str] = UUIDS) -> dict[str, Device]:
    return {u: Device("gpu.nvidia.com", node, f"gpu-{i}", node, u) for i, u in enumerate(uuids)}


def _needs(service: dict[int, str] | None = None, watch: dict[int, str] | None = None, seen: bool = True,
           node: str = "n1", uuids: list[str] = UUIDS) -> list[GpuNeed]:  # fmt: skip
    service, watch = service or {}, watch or {}
    return [GpuNeed(node, str(i), u, [service[i]] if i in service else [], [watch[i]] if i in watch else [], seen)
            for i, u in enumerate(uuids)]  # fmt: skip


def _ours(uuid: str, effect: str) -> TaintRule:
    return TaintRule(rule_name(uuid), effect, "gpu.nvidia.com", "n1", f"gpu-{UUIDS.index(uuid)}", ours=True)


def _kinds(actions: list[DeviceAction]) -> list[tuple[str, str, str]]:
    return [(a.kind, a.gpu, a.effect) for a in actions]


def test_only_the_bad_gpu_is_taken_out_and_the_watched_one_gets_effect_none() -> None:
    devices = {**_devices(), **_devices("n2", OTHER)}
    needs = _needs({1: "uncorrectable ECC errors"}, {2: "XID 63"})
    actions = plan(needs, devices, [], max_out_ratio=0.5, max_node_out_ratio=0.5)
    assert _kinds(actions) == [("drain", "1", "NoSchedule"), ("watch", "2", "None")]
    assert actions[0].reason == "gpuwarden: GPU 1: uncorrectable ECC errors"
    assert actions[0].device == devices[UUIDS[1]] and actions[0].rule == f"gpuwarden-{UUIDS[1].lower()}"
    noexecute = plan(needs, devices, [], 0.5, 0.5, effect="NoExecute")
    assert _kinds(noexecute)[0] == ("drain", "1", "NoExecute")


def test_a_gpu_already_held_as_wanted_is_left_alone_and_a_clean_one_seen_throughout_is_given_back() -> None:
    rules = [_ours(UUIDS[1], "NoSchedule"), _ours(UUIDS[2], "None")]
    held = plan(_needs({1: "ecc"}, {2: "xid"}), _devices(), rules, 1.0, 1.0)
    assert held == []
    clean = plan(_needs(), _devices(), rules, 1.0, 1.0)
    assert _kinds(clean) == [("resume", "1", ""), ("resume", "2", "")]
    assert plan(_needs(seen=False), _devices(), rules, 1.0, 1.0) == []  # nothing known is not clean


def test_a_service_rule_goes_back_to_watch_only_once_seen_over_the_whole_range() -> None:
    rules = [_ours(UUIDS[1], "NoSchedule")]
    assert _kinds(plan(_needs(watch={1: "xid"}), _devices(), rules, 1.0, 1.0)) == [("watch", "1", "None")]
    assert plan(_needs(watch={1: "xid"}, seen=False), _devices(), rules, 1.0, 1.0) == []
    raised = plan(_needs({1: "ecc"}), _devices(), [_ours(UUIDS[1], "None")], 1.0, 1.0)
    assert _kinds(raised) == [("drain", "1", "NoSchedule")]


def test_the_fleet_and_the_node_caps_refuse_and_count_what_others_took_out() -> None:
    devices = {**_devices(), **_devices("n2", OTHER)}  # 8 GPUs, 4 a node
    two_bad = _needs({0: "ecc", 1: "ecc", 2: "ecc"})
    # node cap 0.5 of 4: two out, the third refused
    actions = plan(two_bad, devices, [], max_out_ratio=1.0, max_node_out_ratio=0.5)
    assert _kinds(actions) == [("drain", "0", "NoSchedule"), ("drain", "1", "NoSchedule"), ("refuse", "2", "")]
    assert "would take 3 of 8 GPUs out, 3 of 4 on n1" in actions[2].reason
    # fleet cap 0.25 of 8 = 2, with one GPU of n2 out by the driver's own taint: one more only
    tainted = {**devices, OTHER[0]: Device("gpu.nvidia.com", "n2", "gpu-0", "n2", OTHER[0], tainted=True)}
    assert _kinds(plan(two_bad, tainted, [], 0.25, 1.0)) == [("drain", "0", "NoSchedule"), ("refuse", "1", ""),
                                                               ("refuse", "2", "")]  # fmt: skip
    # someone's rule for the whole pool n2 (driver and pool set) takes its 4 GPUs out; a rule without a selector none
    pool_rule = TaintRule("maintenance-n2", "NoExecute", None, "n2", None)
    no_selector = TaintRule("nothing", "NoSchedule", selected=False)
    assert [a.kind for a in plan(two_bad, devices, [pool_rule, no_selector], 0.5, 1.0)] == ["refuse"] * 3
    assert [a.kind for a in plan(two_bad, devices, [no_selector], 0.5, 1.0)] == ["drain"] * 3
    # a watch rule takes nothing out: effect None is schedulable
    watched = [TaintRule("watching", "None", "gpu.nvidia.com", None, None)]
    assert [a.kind for a in plan(two_bad, devices, watched, 0.375, 1.0)] == ["drain"] * 3


def test_a_gpu_without_a_device_of_the_driver_is_refused_with_why() -> None:
    actions = plan(_needs({3: "ecc"}), _devices(uuids=UUIDS[:3]), [], 1.0, 1.0)
    assert _kinds(actions) == [("refuse", "3", "")]
    assert f"no device of the DRA driver has its UUID {UUIDS[3]}" in actions[0].reason


def test_slices_and_rules_are_read_as_the_api_writes_them() -> None:
    obj = resource_slice("n1", UUIDS[:2], taints={1: [{"key": "gpu.nvidia.com/xid", "value": "79",
                                                        "effect": "NoSchedule"}]})  # fmt: skip
    devices = slice_devices(obj, "gpu.nvidia.com")
    assert [(d.pool, d.name, d.node, d.uuid, d.tainted) for d in devices] == [
        ("n1", "gpu-0", "n1", UUIDS[0], False), ("n1", "gpu-1", "n1", UUIDS[1], True)]  # fmt: skip
    assert slice_devices(obj, "other.example.com") == [] and slice_devices({"spec": []}, "gpu.nvidia.com") == []
    assert taint_rule({"metadata": {"name": "x"}, "spec": {"taint": {"key": "k", "effect": "None"}}}) == TaintRule(
        "x", "None", selected=False)  # fmt: skip
    assert taint_rule({"metadata": {}, "spec": {}}) is None and taint_rule(["not", "a", "rule"]) is None
    # a rule named like ours but without the label is not ours
    assert not taint_rule(
        {"metadata": {"name": rule_name(UUIDS[0])}, "spec": {"taint": {"key": "k", "effect": "None"}}}
    ).ours  # type: ignore[union-attr]


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_the_writes_pass_the_api_schema_and_validation_and_change_only_our_rule(version: str) -> None:
    slices = [resource_slice("n1", UUIDS, version=version), resource_slice("n2", OTHER, version=version),
              resource_slice("n3", ["GPU-x"], driver="other.example.com", version=version)]  # fmt: skip
    with ApiServer([], slices=slices, dra=version) as api:
        dra = DraApi(api.url, deadline=Deadline(30))
        devices = dra.devices()
        assert dra.version == version and sorted(devices) == sorted(UUIDS + OTHER)
        assert ("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dgpu.nvidia.com",
                None) in api.requests  # fmt: skip
        actions = plan(_needs({1: "uncorrectable ECC errors"}, {2: "XID 63"}), devices, dra.rules(), 0.5, 0.5)
        assert [dra.apply_device(a) for a in actions] == [None, None]
        assert api.rejected == []
        drained = api.rules[rule_name(UUIDS[1])]
        assert drained["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1"}
        assert drained["spec"]["taint"]["key"] == "gpuwarden.io/gpu-service"
        assert (drained["spec"]["taint"]["value"], drained["spec"]["taint"]["effect"]) == ("service", "NoSchedule")
        assert drained["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuwarden"}
        assert drained["metadata"]["annotations"]["gpuwarden.io/reasons"].endswith("uncorrectable ECC errors")
        assert api.rules[rule_name(UUIDS[2])]["spec"]["taint"]["effect"] == "None"
        api.rules["someone-elses"] = {"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRule",
                                      "metadata": {"name": "someone-elses", "resourceVersion": "1"},
                                      "spec": {"deviceSelector": {"pool": "n2"},
                                               "taint": {"key": "maintenance", "effect": "NoSchedule"}}}  # fmt: skip
        rules = dra.rules()
        assert {r.name for r in rules if r.ours} == {rule_name(UUIDS[1]), rule_name(UUIDS[2])}
        # the watched GPU now needs service: its rule's effect is raised (409 AlreadyExists, then a PUT)
        raise_it = plan(_needs({1: "ecc", 2: "XID 79"}), devices, rules, 1.0, 1.0)
        assert _kinds(raise_it) == [("drain", "2", "NoSchedule")]
        assert dra.apply_device(raise_it[0]) is None and api.rejected == []
        assert api.rules[rule_name(UUIDS[2])]["spec"]["taint"]["effect"] == "NoSchedule"
        assert [m for m, p, _ in api.requests if "devicetaintrules/" in p][-2:] == ["GET", "PUT"]
        # all clean: ours deleted, someone else's kept
        resumed = plan(_needs(), devices, dra.rules(), 1.0, 1.0)
        assert [dra.apply_device(a) for a in resumed] == [None, None]
        assert sorted(api.rules) == ["someone-elses"]
        assert dra.apply_device(resumed[0]) is None  # a rule already gone counts as deleted
        # a rule of our name that someone else made is not written over
        api.rules[rule_name(UUIDS[3])] = {"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRule",
                                          "metadata": {"name": rule_name(UUIDS[3]), "resourceVersion": "1"},
                                          "spec": {"taint": {"key": "mine", "effect": "None"}}}  # fmt: skip
        [claim] = plan(_needs({3: "ecc"}), devices, dra.rules(), 1.0, 1.0)
        error = dra.apply_device(claim)
        assert error is not None and "not gpuwarden's" in error
        assert api.rules[rule_name(UUIDS[3])]["spec"]["taint"] == {"key": "mine", "effect": "None"}
        dra.close()


def test_a_server_without_device_taint_rules_and_an_invalid_write_are_one_line_errors() -> None:
    with ApiServer([], slices=[resource_slice("n1", UUIDS)], dra=None) as api:
        dra = DraApi(api.url, deadline=Deadline(30))
        with pytest.raises(RuntimeError, match=r"serves no DeviceTaintRule \(v1 or v1beta2 of resource.k8s.io\)"):
            dra.devices()
        dra.close()
    with ApiServer([], slices=[resource_slice("n1", UUIDS)]) as api:
        dra = DraApi(api.url, deadline=Deadline(30))
        bad = DeviceAction("drain", "n1", "0", UUIDS[0], "PreferNoSchedule", "gpuwarden: GPU 0: ecc",
                           Device("gpu.nvidia.com", "n1", "gpu-0", "n1", UUIDS[0]))  # fmt: skip
        error = dra.apply_device(bad)
        assert error is not None and error.startswith("POST /apis/resource.k8s.io/v1/devicetaintrules: 422 ")
        assert "spec.taint.effect: Unsupported value 'PreferNoSchedule'" in error and "\n" not in error
        dra.close()
