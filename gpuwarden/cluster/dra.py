"""Health out to Kubernetes one GPU at a time: a DRA ``DeviceTaintRule`` for each GPU that needs service or watching,
removed once the GPU is clean.

``gpuwarden drain --scheduler dra`` keeps out only the bad GPU where a node taint (gpuwarden.cluster.kube) keeps
every GPU of its node out. Dynamic Resource Allocation's device taints (KEP-5055; ``resource.k8s.io/v1beta2``,
beta in Kubernetes 1.36; ``resource.k8s.io/v1``, stable in 1.37) put a taint on the devices a rule selects by
driver, pool and device name, as the drivers' ResourceSlices publish them; a claim that does not tolerate it is not
allocated the device (``NoSchedule``), its pods are evicted too (``NoExecute``), or nothing happens but the taint
being visible (``None``). The plan (``plan``), per GPU that Prometheus knows (gpuwarden.cluster.quality):

- **drain**: a GPU in the service tier over the range gets the rule ``gpuwarden-<its UUID>`` with the taint
  ``gpuwarden.io/gpu-service=service`` and the effect ``NoSchedule`` (or ``NoExecute``, the command's
  ``--dra-effect``); a watch rule of ours on it has its effect raised;
- **watch**: a GPU in the watch tier gets the same rule with the value ``watch`` and the effect ``None``: visible
  (``kubectl get devicetaintrules``; the rule's status says what ``NoExecute`` would evict), still schedulable;
- **resume**: a rule of ours is deleted once its GPU was seen over the whole range in neither tier; a service rule
  whose GPU was seen over the whole range with only watch reasons goes back to ``None`` (healed of what took it out,
  still watched). A GPU that sent nothing keeps its rule (nothing known is not clean);
- **refuse**: a drain that would leave more than ``max_out_ratio`` of the fleet's GPUs of the driver, or more than
  ``max_node_out_ratio`` of its node's, out of scheduling at once. Out means under a ``NoSchedule`` or ``NoExecute``
  taint, of anyone: a rule that selects the device (all of its driver, pool and device that are set match; an
  empty selector matches all) or a taint the driver put on the device in its ResourceSlice. A GPU without a device
  of the driver whose ``uuid`` attribute is its UUID is refused too, with that reason.

A rule is gpuwarden's when it has the label ``app.kubernetes.io/managed-by=gpuwarden`` and its name is
``gpuwarden-`` and a UUID: only those are changed or deleted (a rule of such a name without the label is reported,
never written over). The rule's annotations carry the reasons
(``gpuwarden.io/reasons``) and the GPU (``gpuwarden.io/gpu``: node, index, UUID).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from gpuwarden.cluster.drain import REASON_CHARS, reason_text
from gpuwarden.cluster.exclude import SERVICE_TAINT_KEY
from gpuwarden.cluster.kube import (
    CONFLICT_TRIES,
    MAX_BYTES,
    MAX_NODE_BYTES,
    KubeApi,
    answer_json,
    as_dict,
    status_message,
)

T = TypeVar("T")

#: NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): the driver name in its ResourceSlices.
DRIVER = "gpu.nvidia.com"
#: resource.k8s.io versions that serve DeviceTaintRule, newest first (v1: Kubernetes 1.37; v1beta2: 1.36).
VERSIONS = ("v1", "v1beta2")
#: The label every rule of gpuwarden's carries (Kubernetes' recommended label for the tool that manages an object).
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpuwarden")
#: The prefix of a rule's name; the rest is the GPU's UUID in lower case.
NAME_PREFIX = "gpuwarden-"
#: Effects that take a device out of scheduling (``None`` leaves it schedulable).
OUT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
#: The effect of a watch rule.
WATCH = "None"
#: Where a rule keeps its reasons, and the GPU it is for.
REASONS_ANNOTATION = "gpuwarden.io/reasons"
GPU_ANNOTATION = "gpuwarden.io/gpu"


@dataclass(frozen=True)
class Device:
    """A device of a ResourceSlice: its ``driver``, ``pool`` and ``name`` (what a rule selects), the ``node`` it is
    on (``spec.nodeName``) and its ``uuid`` attribute; ``tainted``: the driver itself put a NoSchedule or NoExecute
    taint on it (``spec.devices[].taints``)."""

    driver: str
    pool: str
    name: str
    node: str
    uuid: str
    tainted: bool = False


@dataclass(frozen=True)
class TaintRule:
    """A DeviceTaintRule as the API server lists it: its name, its selector (None where a field is not set), its
    taint's effect, and ``ours`` (gpuwarden's label and name); ``selected``: whether it has a selector at all
    (without one it matches no device)."""

    name: str
    effect: str
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    selected: bool = True
    ours: bool = False

    def matches(self, d: Device) -> bool:
        """Whether the rule's selector selects ``d`` (every field that is set equals the device's)."""
        return self.selected and all(
            want is None or want == have
            for want, have in ((self.driver, d.driver), (self.pool, d.pool), (self.device, d.name))
        )


@dataclass(frozen=True)
class GpuNeed:
    """What Prometheus says of one GPU over the range: its node, index and UUID, its service and watch reasons
    (sentences; both empty: clean), and whether it was seen over the whole range."""

    node: str
    gpu: str
    uuid: str
    service: Sequence[str] = ()
    watch: Sequence[str] = ()
    seen: bool = False


@dataclass(frozen=True)
class DeviceAction:
    """One decision on one GPU: ``kind`` drain, watch, resume or refuse; the GPU (node, index, UUID); the rule's
    ``effect`` to set (drain, watch; "" otherwise); the ``device`` (None when none has the GPU's UUID); why."""

    kind: str
    node: str
    gpu: str
    uuid: str
    effect: str
    reason: str
    device: Device | None = field(default=None, compare=False)

    @property
    def rule(self) -> str:
        """The name of gpuwarden's rule for the GPU."""
        return rule_name(self.uuid)


def rule_name(uuid: str) -> str:
    """``gpuwarden-<uuid>``, the UUID in lower case with anything but letters, digits and '-' dropped (a DNS
    subdomain, as the API requires of a name): ``gpuwarden-gpu-96515b22-...``."""
    return (NAME_PREFIX + re.sub(r"[^a-z0-9-]", "", uuid.lower())).rstrip("-")[:253]


def plan(
    needs: Iterable[GpuNeed],
    devices: Mapping[str, Device],
    rules: Sequence[TaintRule],
    max_out_ratio: float,
    max_node_out_ratio: float,
    effect: str = "NoSchedule",
) -> list[DeviceAction]:
    """The actions for the GPUs ``needs`` (see the module), given the driver's ``devices`` (UUID -> Device) and every
    DeviceTaintRule ``rules``; ``effect``: what a service rule sets (NoSchedule or NoExecute). GPUs are taken in
    node and index order; drains before the caps fill."""
    out = _Out(devices, rules, max_out_ratio, max_node_out_ratio)
    ours = {r.name: r for r in rules if r.ours}
    actions: list[DeviceAction] = []
    for need in sorted(needs, key=lambda n: (n.node, _index(n.gpu), n.uuid)):
        device = devices.get(need.uuid)
        decided = _decide(need, ours.get(rule_name(need.uuid)), device, effect, out)
        if decided is not None:
            kind, effect_, why = decided
            actions.append(DeviceAction(kind, need.node, need.gpu, need.uuid, effect_, why, device))
    return actions


def _decide(
    need: GpuNeed, rule: TaintRule | None, device: Device | None, effect: str, out: _Out
) -> tuple[str, str, str] | None:
    """What to do with one GPU (kind, effect, why), None for nothing: see the module. ``rule``: ours on it, if any;
    ``out``: the GPUs out as the plan goes (a drain takes a place within the caps, a watch rule lowered frees one)."""
    if not need.service and not need.watch:
        return ("resume", "", "its GPU was clean over the range") if rule is not None and need.seen else None
    want = effect if need.service else WATCH
    if rule is not None and rule.effect == want:
        return None
    reason = reason_text({need.gpu: list(need.service or need.watch)})
    if device is None:
        return None if rule is not None else ("refuse", "", f"{reason} (no device of the DRA driver has its UUID "
                                                            f"{need.uuid})")  # fmt: skip
    if want == WATCH:
        if rule is not None:  # held out for service: lowered only once seen over the whole range
            if not need.seen:
                return None
            out.lower(device, rule.name)
        return "watch", WATCH, reason
    refused = out.take(device)
    return ("refuse", "", f"{reason} ({refused})") if refused else ("drain", want, reason)


class _Out:
    """The GPUs out of scheduling as a plan goes (their UUIDs): at first those under anyone's NoSchedule or NoExecute
    (a rule that selects the device, or the driver's own taint), then what the plan takes and frees, within
    ``max_out_ratio`` of the driver's GPUs and ``max_node_out_ratio`` of each node's."""

    def __init__(self, devices: Mapping[str, Device], rules: Sequence[TaintRule], max_out_ratio: float,
                 max_node_out_ratio: float) -> None:  # fmt: skip
        self.devices, self.rules = devices, rules
        self.max_out_ratio, self.max_node_out_ratio = max_out_ratio, max_node_out_ratio
        self.uuids = {u for u, d in devices.items() if _out_by_others(d, rules, "")}
        self.per_node = Counter(d.node for d in devices.values())

    def take(self, device: Device) -> str:
        """Take ``device`` out: "" when it is out already or fits within both caps, else why not."""
        if device.uuid in self.uuids:
            return ""
        node_out = sum(1 for u in self.uuids if self.devices[u].node == device.node) + 1
        total, on_node = len(self.devices), self.per_node[device.node]
        if len(self.uuids) + 1 > self.max_out_ratio * total or node_out > self.max_node_out_ratio * on_node:
            return (f"would take {len(self.uuids) + 1} of {total} GPUs out, {node_out} of {on_node} on {device.node}: "
                    f"more than max_out_ratio {self.max_out_ratio:g} or max_node_out_ratio "
                    f"{self.max_node_out_ratio:g}")  # fmt: skip
        self.uuids.add(device.uuid)
        return ""

    def lower(self, device: Device, ours: str) -> None:
        """Our rule ``ours`` on ``device`` goes to effect None: the device is back unless someone else keeps it out."""
        if not _out_by_others(device, self.rules, ours):
            self.uuids.discard(device.uuid)


def _out_by_others(device: Device, rules: Sequence[TaintRule], ours: str) -> bool:
    """Whether ``device`` is out by the driver's taint or a rule other than ``ours`` ("": any rule)."""
    return device.tainted or any(r.effect in OUT_EFFECTS and r.name != ours and r.matches(device) for r in rules)


def _index(gpu: str) -> tuple[int, str]:
    """A GPU index for ordering: numbers by value, anything else after them."""
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def slice_devices(slice_: Any, driver: str) -> list[Device]:
    """The Devices of one ResourceSlice object ``slice_`` (a dict as the API answers) of ``driver`` on one node;
    devices without a string ``uuid`` attribute left out, as are slices of another driver or of no node."""
    spec = slice_.get("spec") if isinstance(slice_, dict) else None
    if not isinstance(spec, dict) or spec.get("driver") != driver or not isinstance(spec.get("nodeName"), str):
        return []
    pool = spec.get("pool")
    pool_name = pool.get("name") if isinstance(pool, dict) else None
    if not isinstance(pool_name, str):
        return []
    out = []
    for dev in spec.get("devices") or []:
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            continue
        attrs = dev.get("attributes")
        uuid = attrs.get("uuid") if isinstance(attrs, dict) else None
        if not (isinstance(uuid, dict) and isinstance(uuid.get("string"), str)):
            continue
        tainted = any(isinstance(t, dict) and t.get("effect") in OUT_EFFECTS for t in dev.get("taints") or [])
        out.append(Device(driver, pool_name, dev["name"], spec["nodeName"], uuid["string"], tainted))
    return out


def taint_rule(obj: Any) -> TaintRule | None:
    """The TaintRule of a DeviceTaintRule object ``obj``, None for one without a name or a taint."""
    if not isinstance(obj, dict):
        return None
    meta, spec = (as_dict(obj.get(k)) for k in ("metadata", "spec"))
    name, taint = meta.get("name"), spec.get("taint")
    if not isinstance(name, str) or not isinstance(taint, dict):
        return None
    sel = spec.get("deviceSelector")
    labels = as_dict(meta.get("labels"))
    ours = labels.get(MANAGED_BY[0]) == MANAGED_BY[1] and name.startswith(NAME_PREFIX)

    def text(key: str) -> str | None:
        value = sel.get(key) if isinstance(sel, dict) else None
        return value if isinstance(value, str) else None

    return TaintRule(name, str(taint.get("effect")), text("driver"), text("pool"), text("device"),
                     isinstance(sel, dict), ours)  # fmt: skip


def rule_object(action: DeviceAction, version: str) -> dict[str, Any]:
    """The DeviceTaintRule gpuwarden writes for a drain or watch ``action`` in ``resource.k8s.io/<version>``: the
    device selected by driver, pool and name; the taint ``gpuwarden.io/gpu-service=<service|watch>:<effect>``; the
    reasons and the GPU in annotations. Raises ValueError for an action without a device."""
    d = action.device
    if d is None:
        raise ValueError(f"no device for GPU {action.gpu} on {action.node}: nothing to select")
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": action.rule,
            "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
            "annotations": {
                REASONS_ANNOTATION: action.reason[: REASON_CHARS * 8],
                GPU_ANNOTATION: f"{action.node} GPU {action.gpu} {action.uuid}",
            },
        },
        "spec": {
            "deviceSelector": {"driver": d.driver, "pool": d.pool, "device": d.name},
            "taint": {
                "key": SERVICE_TAINT_KEY,
                "value": "service" if action.effect in OUT_EFFECTS else "watch",
                "effect": action.effect,
            },
        },
    }


class DraApi(KubeApi):
    """The API server's DRA resources (``resource.k8s.io``, the first of VERSIONS it serves): the devices of
    ``driver`` from the ResourceSlices, the DeviceTaintRules, and gpuwarden's writes to them. Requests as KubeApi's
    (one deadline for the command, answers bounded)."""

    def __init__(self, *args: Any, driver: str = DRIVER, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.driver = driver
        self.version = ""

    def _each(self, resource: str, take: Callable[[Any], list[T]], query: str = "") -> list[T]:
        """What ``take`` makes of each member of ``resource``'s list, concatenated: the members are read one at a
        time (bounds.listed) and only what ``take`` keeps of each is held, from the first of VERSIONS the server
        serves (remembered). Raises RuntimeError: no version served, an HTTP error, a bad answer."""
        from gpuwarden.cluster.bounds import listed

        for version in (self.version,) if self.version else VERSIONS:
            path = f"/apis/resource.k8s.io/{version}/{resource}{query}"

            def read(status: int, chunks: Any, what: str = f"GET {path}") -> list[T] | None:
                if status == 404:
                    return None
                if status != 200:
                    answer_json(what, status, b"".join(chunks))
                return [kept for item in listed(chunks, "items", MAX_NODE_BYTES, what) for kept in take(item)]

            try:
                items = self._request("GET", path, read, limit=MAX_BYTES)
            except ValueError as exc:
                raise RuntimeError(str(exc)) from None
            if isinstance(items, list):
                self.version = version
                return items
        raise RuntimeError(f"the API server serves no DeviceTaintRule ({' or '.join(VERSIONS)} of resource.k8s.io): "
                           "DRA device taints need Kubernetes 1.36 (beta) or 1.37")  # fmt: skip

    def devices(self) -> dict[str, Device]:
        """The driver's devices by UUID (``GET .../resourceslices?fieldSelector=spec.driver=<driver>``; slices of
        another driver left out again where a server ignores the selector), a slice at a time. Raises RuntimeError
        or httpx.HTTPError."""
        query = "?fieldSelector=" + quote(f"spec.driver={self.driver}", safe="")
        return {d.uuid: d for d in self._each("resourceslices", lambda item: slice_devices(item, self.driver), query)}

    def rules(self) -> list[TaintRule]:
        """Every DeviceTaintRule (``GET .../devicetaintrules``): anyone's can take a device out. Raises RuntimeError
        or httpx.HTTPError."""
        return self._each("devicetaintrules", lambda obj: [r] if (r := taint_rule(obj)) is not None else [])

    def apply_device(self, action: DeviceAction) -> str | None:
        """Create or update (drain, watch) or delete (resume) gpuwarden's rule for ``action``'s GPU; None when done
        (a rule already gone counts as deleted), else the API server's error in one line. A refusal writes
        nothing."""
        if action.kind == "refuse":
            return None
        path = f"/apis/resource.k8s.io/{self.version or VERSIONS[0]}/devicetaintrules"
        named = f"{path}/{quote(action.rule, safe='')}"
        answer = lambda st, chunks: (st, b"".join(chunks))  # noqa: E731 - the status and the body, read whole
        try:
            if action.kind == "resume":
                status, body = self._request("DELETE", named, answer)
                return None if status in (200, 202, 404) else f"DELETE {named}: {status} {status_message(body)}"
            new = rule_object(action, self.version or VERSIONS[0])
            status, body = self._request("POST", path, answer, body=new)
            if status in (200, 201):
                return None
            if status != 409:  # 409 AlreadyExists: ours is there; its effect changes
                return f"POST {path}: {status} {status_message(body)}"
            for _ in range(CONFLICT_TRIES):
                stored = self._get(named)
                held = taint_rule(stored)
                if held is None or not held.ours:  # a rule of that name someone else made: never written over
                    return f"PUT {named}: a DeviceTaintRule of that name is not gpuwarden's (no {MANAGED_BY[0]} label)"
                stored["metadata"]["annotations"] = new["metadata"]["annotations"]
                stored["spec"] = new["spec"]
                status, body = self._request("PUT", named, answer, body=stored)
                if status != 409:
                    return None if status == 200 else f"PUT {named}: {status} {status_message(body)}"
            return f"PUT {named}: the rule kept changing ({CONFLICT_TRIES} conflicts)"
        except (httpx.HTTPError, RuntimeError, ValueError, KeyError, TypeError) as exc:
            return str(exc)[:200]
