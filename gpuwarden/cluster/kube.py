"""Health out to Kubernetes: a node's GPU service need as a node condition and a taint, set and cleared through the
API server.

``gpuwarden drain --scheduler kubernetes`` plans as for Slurm (gpuwarden.cluster.drain.plan) over the API server's
nodes (``GET /api/v1/nodes``) and acts on each node with two writes:

- **the taint** ``gpuwarden.io/gpu-service=gpu<indices>:NoSchedule`` in ``spec.taints`` (``PUT /api/v1/nodes/NAME``):
  the scheduler places no new pod that does not tolerate it; running pods stay, as a Slurm drain lets jobs end;
- **the condition** ``GPUNeedsService`` in ``status.conditions`` (``PUT /api/v1/nodes/NAME/status``): status ``True``
  with reason ``GpuwardenService`` and the GPUs' reasons as its message, as Node Problem Detector writes its
  problems; ``False`` with reason ``GpuwardenClean`` on resume.

Each write sends back the node as read with only gpuwarden's taint or condition changed, with its
``metadata.resourceVersion``: a node changed in between (the kubelet writes its status every few seconds) is
answered 409 Conflict, read again and written again (client-go's retry on conflict), at most CONFLICT_TRIES times.
A node is ``out`` when cordoned (``spec.unschedulable``), not Ready, or tainted by gpuwarden; it is ``ours`` when it
has gpuwarden's taint (so a node a person cordoned is never uncordoned: gpuwarden removes only its own taint).

The API server: in a pod, the service account's token and CA (gpuwarden.kubelet.apiserver); elsewhere any address
that authenticates for us (``kubectl proxy``: ``--kube-api http://127.0.0.1:8001``). The account needs ``get``,
``list`` and ``update`` on ``nodes`` and ``update`` on ``nodes/status`` (deploy/kubernetes/drain-cronjob.yaml).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from gpuwarden.cluster.bounds import AnswerTooLarge, Deadline, DeadlineExceeded, decoded, listed
from gpuwarden.cluster.drain import PREFIX, Action
from gpuwarden.cluster.exclude import K8S_NODE, SERVICE_TAINT_KEY

#: The node condition gpuwarden sets (status True: a GPU needs service).
CONDITION = "GPUNeedsService"
#: How many times a write that met a changed node (409 Conflict) is read and tried again.
CONFLICT_TRIES = 5
#: The largest answer read, inflated (a node list of a large cluster is tens of MB; it is read one node at a time).
MAX_BYTES = 64 * 1024 * 1024
#: The largest node read: etcd refuses objects past 1.5 MiB, so a node over this is not one the API server stores.
MAX_NODE_BYTES = 2 * 1024 * 1024
#: A condition's message is cut here (the API keeps any length; `kubectl describe` shows it on one line).
MESSAGE_CHARS = 1024


@dataclass(frozen=True)
class KubeNode:
    """A node as the API server lists it: whether it is out of service (cordoned, not Ready or tainted by
    gpuwarden) and whether gpuwarden's taint is on it."""

    name: str
    out: bool
    ours: bool


def node_state(obj: Any) -> KubeNode | None:
    """The KubeNode of a Node object ``obj`` (a dict as the API answers), None for one without a valid name."""
    if not isinstance(obj, dict):
        return None
    meta, spec, status = (as_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    name = meta.get("name")
    if not isinstance(name, str) or not K8S_NODE.match(name):
        return None
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    ours = any(t.get("key") == SERVICE_TAINT_KEY for t in taints)
    ready = any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return KubeNode(name, bool(spec.get("unschedulable")) or not ready or ours, ours)


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` where it is a dict, else an empty one (a field the API left out or a hostile answer)."""
    return value if isinstance(value, dict) else {}


def taint_value(reason: str) -> str:
    """The taint's value for a drain reason ``gpuwarden: GPU 0: ...; GPU 3: ...``: ``gpu0_3`` (a label value: at
    most 63 characters of [A-Za-z0-9._-])."""
    return ("gpu" + "_".join(re.findall(r"(?:^|; )GPU (\d+): ", reason.removeprefix(PREFIX).strip())))[:63]


def with_taint(node: dict[str, Any], action: Action) -> dict[str, Any]:
    """``node`` with gpuwarden's taint set (drain) or removed (resume); other taints as they were."""
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if not (isinstance(t, dict) and t.get("key") == SERVICE_TAINT_KEY)]
    if action.kind == "drain":
        taints.append({"key": SERVICE_TAINT_KEY, "value": taint_value(action.reason), "effect": "NoSchedule"})
    if taints:
        spec["taints"] = taints
    else:
        spec.pop("taints", None)
    return node


def with_condition(node: dict[str, Any], action: Action, now: datetime) -> dict[str, Any]:
    """``node`` with the GPUNeedsService condition True (drain) or False (resume) and the action's reason as its
    message; its transition time moves only when its status changes; other conditions as they were."""
    status = node.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    old = next((c for c in conditions if c.get("type") == CONDITION), None)
    value = "True" if action.kind == "drain" else "False"
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new = {
        "type": CONDITION,
        "status": value,
        "reason": "GpuwardenService" if action.kind == "drain" else "GpuwardenClean",
        "message": action.reason[:MESSAGE_CHARS],
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == value else stamp,
    }
    status["conditions"] = [c for c in conditions if c is not old] + [new]
    return node


class KubeApi:
    """The API server at ``api`` (``https://host:port`` or a ``kubectl proxy`` address), with a bearer token read
    from ``token_file`` (None: no Authorization header) and the CA bundle ``ca_file`` (None: the system's). Every
    request is answered by ``deadline`` (the command's --timeout, shared with its Prometheus queries) or ends in
    RuntimeError; an answer is inflated in bounded steps, never past MAX_BYTES (gpuwarden.cluster.bounds)."""

    def __init__(self, api: str, token_file: str | None = None, ca_file: str | None = None,
                 deadline: Deadline | None = None) -> None:  # fmt: skip
        self.api = api.rstrip("/")
        self.deadline = deadline or Deadline(60.0)
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        if token_file:
            with open(token_file, encoding="utf-8") as f:
                headers["Authorization"] = f"Bearer {f.read().strip()}"
        self._client = httpx.Client(timeout=self.deadline.seconds, headers=headers, verify=ca_file or True)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _request(self, method: str, path: str, read: Any, body: Any = None, limit: int = MAX_NODE_BYTES) -> Any:
        """``method path`` (``body`` as JSON), its answer inflated within ``limit`` and handed to ``read(status,
        chunks)`` within the deadline; what ``read`` returns. Raises RuntimeError (past the deadline or the bound,
        or ``read``'s), httpx.HTTPError when the server cannot be reached."""
        what = f"{method} {path}"

        def exchange(left: float) -> Any:
            with self._client.stream(method, self.api + path, json=body, timeout=left) as r:
                return read(r.status_code, decoded(r.iter_raw(), r.headers.get("content-encoding"), limit, what))

        try:
            return self.deadline.call(exchange, what)
        except (DeadlineExceeded, AnswerTooLarge) as exc:
            raise RuntimeError(str(exc)) from None

    def _get(self, path: str) -> Any:
        """The JSON object answered to ``GET path`` (a node: at most MAX_NODE_BYTES). Raises RuntimeError with the
        server's message on an HTTP error (see _request); httpx.HTTPError when it cannot be reached."""
        return self._request("GET", path, lambda status, chunks: answer_json(f"GET {path}", status, b"".join(chunks)))

    def nodes(self) -> dict[str, KubeNode]:
        """The cluster's nodes by name (``GET /api/v1/nodes``), read one node at a time (bounds.listed: a list of
        thousands costs one node's tree, not the list's); nodes without a valid name left out. Raises RuntimeError or
        httpx.HTTPError (see _request)."""
        what = "GET /api/v1/nodes"

        def read(status: int, chunks: Any) -> dict[str, KubeNode]:
            if status != 200:
                answer_json(what, status, b"".join(chunks))
            out: dict[str, KubeNode] = {}
            for item in listed(chunks, "items", MAX_NODE_BYTES, what):
                node = node_state(item)
                if node is not None:
                    out[node.name] = node
            return out

        try:
            nodes: dict[str, KubeNode] = self._request("GET", "/api/v1/nodes", read, limit=MAX_BYTES)
            return nodes
        except ValueError as exc:
            raise RuntimeError(str(exc)) from None

    def apply(self, action: Action, now: datetime | None = None) -> str | None:
        """Set (drain) or clear (resume) gpuwarden's taint and condition on ``action.node``; None when done, else
        the API server's error in one line. A refusal writes nothing."""
        if action.kind == "refuse":
            return None
        when = now or datetime.now(UTC)
        path = f"/api/v1/nodes/{quote(action.node, safe='')}"
        try:
            for suffix, change in (("", lambda n: with_taint(n, action)),
                                   ("/status", lambda n: with_condition(n, action, when))):  # fmt: skip
                error = self._update(path, suffix, change)
                if error:
                    return error
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            return str(exc)[:200]
        return None

    def _update(self, path: str, suffix: str, change: Any) -> str | None:
        """Read the node at ``path``, apply ``change`` and ``PUT`` it to ``path + suffix``, again on 409 Conflict;
        None when written, else the error."""
        for _ in range(CONFLICT_TRIES):
            node = change(self._get(path))
            status, answer = self._request("PUT", path + suffix, lambda st, chunks: (st, b"".join(chunks)), body=node)
            if status == 409:
                continue
            return None if status == 200 else f"PUT {path}{suffix}: {status} {status_message(answer)}"
        return f"PUT {path}{suffix}: the node kept changing ({CONFLICT_TRIES} conflicts)"


def answer_json(what: str, status: int, body: bytes) -> Any:
    """``body`` as JSON when ``status`` is 200. Raises RuntimeError with the server's message otherwise, or when the
    body is not JSON."""
    if status != 200:
        raise RuntimeError(f"{what}: {status} {status_message(body)}")
    try:
        return json.loads(body)
    except ValueError:
        raise RuntimeError(f"{what}: an answer that is not JSON") from None


def status_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status answer, else the body's first 200 characters, on one line."""
    try:
        doc = json.loads(body)
        text = doc.get("message") if isinstance(doc, dict) else None
    except ValueError:
        text = None
    return " ".join(str(text or body[:200].decode("utf-8", "replace")).split())[:200]
