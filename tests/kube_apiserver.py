"""A stand-in for the Kubernetes API server's Node endpoints, for the tests of ``gpuwarden drain --scheduler
kubernetes``: it holds Node objects and answers as the API server does, checking every write against the API's
schema.

- ``GET /api/v1/nodes`` (a NodeList) and ``GET /api/v1/nodes/NAME`` (404 with a Status for an unknown node);
- ``PUT /api/v1/nodes/NAME`` (spec and metadata; the status sent is ignored, as the API server does) and
  ``PUT /api/v1/nodes/NAME/status`` (the status; spec and metadata sent are ignored);
- every PUT body is validated against Kubernetes 1.30's published schema for Node, strict (no unknown field), by
  kubernetes-validate (its JSON schemas are generated from the API's OpenAPI document), then by the checks the API
  server's validation adds that the schema cannot say: a taint's key is a qualified name, its value a label value and
  its effect one of three; a condition's status True, False or Unknown; times in RFC 3339; at most one taint per key
  and effect. Failures answer 422 with the reasons; a ``metadata.resourceVersion`` that is not the stored one answers
  409 Conflict; a missing or wrong bearer token 401 (where a token is set);
- ``conflicts``: how many of the next PUTs to answer 409 after bumping the node's version, as the kubelet's own
  status writes do between a read and a write.

DRA (``dra``: the resource.k8s.io version served, "v1" as Kubernetes 1.37 serves it, "v1beta2" as 1.36 does, None for
a server without it, whose DRA paths answer 404): ``GET .../resourceslices`` (the ``slices`` given, filtered by a
``spec.driver`` field selector) and ``GET``, ``POST``, ``PUT``, ``DELETE`` on ``.../devicetaintrules``, held in
``rules`` (name -> DeviceTaintRule). A written rule is checked against that Kubernetes version's published schema,
strict, then as the API server's validation does beyond it (pkg/apis/resource/validation): the name a DNS subdomain;
the taint's key a label name, its value a label value, its effect None, NoSchedule or NoExecute; the selector's
driver a DNS subdomain of at most 63 characters, its pool at most 253 in DNS-subdomain segments, its device a DNS
label. A POST of a name held answers 409 AlreadyExists, a PUT with a stale ``resourceVersion`` 409 Conflict; the
server sets ``timeAdded`` where it is missing or the effect changed, as the API server does.

Every request is appended to ``requests`` as (method, path, body).
"""

from __future__ import annotations

import copy
import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]

VERSION = "1.30"
#: The Kubernetes version whose schema a DeviceTaintRule of each resource.k8s.io version is checked against.
DRA_SCHEMAS = {"v1": "1.37", "v1beta2": "1.36"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")  # fmt: skip
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def node(name: str, ready: bool = True, unschedulable: bool = False, taints: list[dict] | None = None) -> dict:
    """A Node as a kubelet registers it (the fields the API would hold), Ready or not."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "uid": f"uid-{name}",
            "labels": {"kubernetes.io/hostname": name},
        },  # fmt: skip
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2026-11-27T00:00:00Z",
                    "lastTransitionTime": "2026-11-27T00:00:00Z",
                }
            ],  # fmt: skip
            "capacity": {"nvidia.com/gpu": "8"},
        },
    }
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    if taints:
        obj["spec"]["taints"] = taints
    return obj


def resource_slice(node_name: str, uuids: list[str], driver: str = "gpu.nvidia.com", version: str = "v1",
                   taints: dict[int, list[dict]] | None = None) -> dict:  # fmt: skip
    """A ResourceSlice as NVIDIA's DRA driver publishes one for a node: a pool named after the node, device ``gpu-i``
    for GPU i with its ``uuid`` and ``index`` attributes (``taints``: the driver's own, by index). Checked against
    the schema of its version before it is handed out."""
    devices = []
    for i, uuid in enumerate(uuids):
        dev: dict[str, Any] = {"name": f"gpu-{i}", "attributes": {"uuid": {"string": uuid}, "index": {"int": i},
                               "type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}},
                               "capacity": {"memory": {"value": "141Gi"}}}  # fmt: skip
        if taints and i in taints:
            dev["taints"] = taints[i]
        devices.append(dev)
    obj = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-{driver}-x7k2p", "resourceVersion": "1"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },  # fmt: skip
    }
    kubernetes_validate.validate(obj, DRA_SCHEMAS[version], strict=True)
    return obj


def rule_errors(obj: dict) -> list[str]:
    """What the API server's validation of a DeviceTaintRule rejects beyond the schema."""
    errors = []
    name = (obj.get("metadata") or {}).get("name") or ""
    if not DNS_SUBDOMAIN.match(name):
        errors.append(f"metadata.name: Invalid value {name!r}: not a DNS subdomain")
    spec = obj.get("spec") or {}
    errors += taint_errors(spec.get("taint") or {}, "spec.taint", ("None", "NoSchedule", "NoExecute"))
    sel = spec.get("deviceSelector") or {}
    if "driver" in sel and not (DNS_SUBDOMAIN.match(sel["driver"] or "") and len(sel["driver"]) <= 63):
        errors.append(f"spec.deviceSelector.driver: Invalid value {sel['driver']!r}")
    if "pool" in sel and not (all(DNS_SUBDOMAIN.match(p) for p in (sel["pool"] or "").split("/"))
                              and len(sel["pool"]) <= 253):  # fmt: skip
        errors.append(f"spec.deviceSelector.pool: Invalid value {sel['pool']!r}")
    if "device" in sel and not DNS_LABEL.match(sel["device"] or ""):
        errors.append(f"spec.deviceSelector.device: Invalid value {sel['device']!r}: not a DNS label")
    return errors


def taint_errors(taint: dict, where: str, effects: tuple[str, ...]) -> list[str]:
    """What the API server rejects in a taint (a node's or a device's, at ``where``): a key that is not a qualified
    (label) name, a value that is not a label value, an effect not in ``effects``."""
    errors = []
    if not QUALIFIED.match(taint.get("key") or ""):
        errors.append(f"{where}.key: Invalid value {taint.get('key')!r}: not a qualified name")
    if not LABEL_VALUE.match(taint.get("value") or ""):
        errors.append(f"{where}.value: Invalid value {taint.get('value')!r}: not a label value")
    if taint.get("effect") not in effects:
        errors.append(f"{where}.effect: Unsupported value {taint.get('effect')!r}")
    return errors


def semantic_errors(obj: dict) -> list[str]:
    """What the API server's validation rejects beyond the schema, for the fields gpuwarden writes."""
    errors = []
    seen = set()
    for t in (obj.get("spec") or {}).get("taints") or []:
        errors += taint_errors(t, "spec.taints", ("NoSchedule", "PreferNoSchedule", "NoExecute"))
        if (t.get("key"), t.get("effect")) in seen:
            errors.append(f"spec.taints: Duplicate value {t.get('key')}:{t.get('effect')}")
        seen.add((t.get("key"), t.get("effect")))
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("status") not in ("True", "False", "Unknown"):
            errors.append(f"status.conditions.status: Unsupported value {c.get('status')!r}")
        for key in ("lastHeartbeatTime", "lastTransitionTime"):
            if key in c:
                try:
                    datetime.strptime(c[key], "%Y-%m-%dT%H:%M:%SZ")
                except (TypeError, ValueError):
                    errors.append(f"status.conditions.{key}: Invalid value {c[key]!r}: not RFC 3339")
    return errors


class ApiServer:
    """The stand-in on 127.0.0.1 (``url``), holding ``nodes`` (name -> Node); ``token``: the bearer token it asks
    for (None: none). Use as a context manager."""

    def __init__(self, nodes: list[dict], token: str | None = None, slices: list[dict] | None = None,
                 dra: str | None = "v1") -> None:  # fmt: skip
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.slices = copy.deepcopy(slices or [])
        self.dra = dra
        self.rules: dict[str, dict] = {}
        self._version = 100
        self.token = token
        self.conflicts = 0
        self.requests: list[tuple[str, str, Any]] = []
        self.rejected: list[str] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _allowed(self) -> bool:
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server.requests.append(("GET", self.path, None))
                if not self._allowed():
                    return
                if self.path.startswith("/apis/"):
                    self._answer(*server._dra("GET", self.path, None))
                    return
                with server._lock:
                    if self.path.split("?")[0] == "/api/v1/nodes":
                        items = [copy.deepcopy(n) for n in server.nodes.values()]
                        self._answer(200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items})
                        return
                    m = re.fullmatch(r"/api/v1/nodes/([^/]+)", self.path)
                    if m and m.group(1) in server.nodes:
                        self._answer(200, server.nodes[m.group(1)])
                        return
                self._answer(404, _status(404, "NotFound", f"nodes {self.path.rsplit('/', 1)[-1]!r} not found"))

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self._write("POST")

            def do_DELETE(self) -> None:  # noqa: N802 - http.server's name
                self._write("DELETE")

            def do_PUT(self) -> None:  # noqa: N802 - http.server's name
                self._write("PUT")

            def _write(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length)) if length else None
                except ValueError:
                    body = None
                server.requests.append((method, self.path, body))
                if not self._allowed():
                    return
                if self.path.startswith("/apis/"):
                    self._answer(*server._dra(method, self.path, body))
                    return
                if method != "PUT":
                    self._answer(405, _status(405, "MethodNotAllowed", "the server does not allow this method"))
                    return
                m = re.fullmatch(r"/api/v1/nodes/([^/]+?)(/status)?", self.path)
                if not m or not isinstance(body, dict):
                    self._answer(400, _status(400, "BadRequest", "not a node"))
                    return
                code, answer = server._put(m.group(1), bool(m.group(2)), body)
                self._answer(code, answer)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def _put(self, name: str, status: bool, body: dict) -> tuple[int, Any]:
        with self._lock:
            stored = self.nodes.get(name)
            if stored is None:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found')
            if self.conflicts:
                self.conflicts -= 1
                stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
            if (body.get("metadata") or {}).get("name") != name:
                return 400, _status(400, "BadRequest", "the name of the object does not match the name on the URL")
            if (body.get("metadata") or {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object '
                                    "has been modified; please apply your changes to the latest version and try "
                                    "again")  # fmt: skip
            new = copy.deepcopy(stored)
            if status:
                new["status"] = body.get("status") or {}
            else:
                new["metadata"], new["spec"] = body.get("metadata") or {}, body.get("spec") or {}
            errors = []
            try:
                kubernetes_validate.validate(new, VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{'.'.join(str(p) for p in exc.path)}: {exc.message}")
            errors += semantic_errors(new)
            if errors:
                self.rejected += errors
                return 422, _status(422, "Invalid", f'Node "{name}" is invalid: {"; ".join(errors)}')
            new["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
            self.nodes[name] = new
            return 200, new

    def _dra(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """An answer to ``method path`` under /apis (DRA's resources; 404 for anything else)."""
        m = re.fullmatch(r"/apis/resource\.k8s\.io/([^/]+)/(resourceslices|devicetaintrules)(?:/([^/?]+))?(\?.*)?",
                         path)  # fmt: skip
        if not m or m.group(1) != self.dra:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        version, resource, name, query = m.groups()
        with self._lock:
            if resource == "resourceslices":
                if method != "GET" or name:
                    return 405, _status(405, "MethodNotAllowed", "read-only here")
                driver = re.search(r"fieldSelector=spec\.driver%3D([^&]+)", query or "")
                items = [s for s in self.slices if not driver or s["spec"]["driver"] == driver.group(1)]
                listing = {"resourceVersion": str(self._version)}
                return 200, {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSliceList",
                             "metadata": listing, "items": copy.deepcopy(items)}  # fmt: skip
            if method == "GET" and not name:
                return 200, {"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRuleList",
                             "metadata": {"resourceVersion": str(self._version)},
                             "items": copy.deepcopy(list(self.rules.values()))}  # fmt: skip
            stored = self.rules.get(name) if name else None
            if method in ("GET", "DELETE", "PUT") and stored is None:
                return 404, _status(404, "NotFound", f'devicetaintrules.resource.k8s.io "{name}" not found')
            if method == "GET":
                return 200, copy.deepcopy(stored)
            if method == "DELETE":
                del self.rules[name]
                return 200, stored
            if not isinstance(body, dict):
                return 400, _status(400, "BadRequest", "not a DeviceTaintRule")
            new = copy.deepcopy(body)
            meta = new.setdefault("metadata", {})
            if method == "POST":
                if name:
                    return 405, _status(405, "MethodNotAllowed", "POST to the collection")
                if meta.get("name") in self.rules:
                    return 409, _status(
                        409, "AlreadyExists", f'devicetaintrules.resource.k8s.io "{meta.get("name")}" already exists'
                    )
            else:
                if meta.get("name") != name:
                    return 400, _status(400, "BadRequest", "the name of the object does not match the name on the URL")
                if meta.get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on devicetaintrules '
                                        f'"{name}": the object has been modified')  # fmt: skip
            errors = []
            try:
                kubernetes_validate.validate(new, DRA_SCHEMAS[version], strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{'.'.join(str(p) for p in exc.path)}: {exc.message}")
            errors += rule_errors(new)
            if errors:
                self.rejected += errors
                return 422, _status(422, "Invalid", f'DeviceTaintRule "{meta.get("name")}" is invalid: '
                                    f'{"; ".join(errors)}')  # fmt: skip
            taint = new["spec"]["taint"]
            old_effect = stored["spec"]["taint"]["effect"] if stored else None
            if "timeAdded" not in taint or old_effect != taint["effect"]:
                taint["timeAdded"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._version += 1
            meta["resourceVersion"] = str(self._version)
            meta.setdefault("uid", f"uid-{meta['name']}")
            self.rules[meta["name"]] = new
            return (201 if method == "POST" else 200), copy.deepcopy(new)

    def __enter__(self) -> ApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _status(code: int, reason: str, message: str) -> dict:
    """A metav1.Status, as the API server answers a failure."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip
