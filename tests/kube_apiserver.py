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

Every request is appended to ``requests`` as (method, path, body).
"""

from __future__ import annotations

import copy
import json
import re
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]

VERSION = "1.30"
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


def semantic_errors(obj: dict) -> list[str]:
    """What the API server's validation rejects beyond the schema, for the fields gpuwarden writes."""
    errors = []
    seen = set()
    for t in (obj.get("spec") or {}).get("taints") or []:
        if not QUALIFIED.match(t.get("key") or ""):
            errors.append(f"spec.taints.key: Invalid value {t.get('key')!r}: not a qualified name")
        if not LABEL_VALUE.match(t.get("value") or ""):
            errors.append(f"spec.taints.value: Invalid value {t.get('value')!r}: not a label value")
        if t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            errors.append(f"spec.taints.effect: Unsupported value {t.get('effect')!r}")
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

    def __init__(self, nodes: list[dict], token: str | None = None) -> None:
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
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

            def do_PUT(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length))
                except ValueError:
                    body = None
                server.requests.append(("PUT", self.path, body))
                if not self._allowed():
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
