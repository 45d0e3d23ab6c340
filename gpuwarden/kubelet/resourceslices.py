"""This node's ResourceSlices of NVIDIA's DRA driver, from the Kubernetes API: each device name's UUID.

A ResourceClaim's allocation names devices by the DRA driver's names (``gpu-0``, ``gpu-0-mig-...``), which the
kubelet's pod-resources API passes on. The names need not follow NVML's index order (MIG devices are created on
demand, a driver may number differently), but the ResourceSlice the driver publishes for the node gives each
device's attributes, ``uuid`` among them (the GPU's, or the MIG device's). ``DraDevices.uuids()`` maps name -> UUID
from the last answer of ``GET /apis/resource.k8s.io/{v1,v1beta2,v1beta1}/resourceslices`` with the field selectors
``spec.nodeName`` and ``spec.driver`` (the first version the server serves), asked in the background every
``refresh_seconds``: the poll never waits on the API server. In-cluster only: the service account's token and CA
(``/var/run/secrets/kubernetes.io/serviceaccount``) and ``KUBERNETES_SERVICE_HOST``/``_PORT``; the account needs
``list`` on ``resourceslices`` (the dra component of deploy/kubernetes/components).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpuwarden.kubelet.apiserver import SERVICE_ACCOUNT, in_cluster_address

log = logging.getLogger("gpuwarden.kubelet")

#: ResourceSlice API versions, newest first (v1 from Kubernetes 1.34; v1beta2 1.33; v1beta1 1.32).
VERSIONS = ("v1", "v1beta2", "v1beta1")
#: The largest answer read (a node's slices are a few kB per GPU).
MAX_BYTES = 8 * 1024 * 1024


class DraDevices:
    """Device name -> UUID of the DRA driver ``driver``'s devices on node ``node`` (``uuids()``), read from the API
    server at ``api`` (default: in-cluster) with the bearer token in ``token_file`` and the CA in ``ca_file``.
    Never raises from ``uuids()``: an unreachable or refusing API server is logged once per outage and keeps the last
    answer (the devices of a node change rarely). Raises ValueError at construction when ``api`` is None and the
    in-cluster variables are missing."""

    def __init__(self, node: str, driver: str = "gpu.nvidia.com", api: str | None = None,
                 token_file: Path = SERVICE_ACCOUNT / "token", ca_file: Path | None = SERVICE_ACCOUNT / "ca.crt",
                 refresh_seconds: float = 60.0, timeout: float = 5.0) -> None:  # fmt: skip
        if api is None:
            api = in_cluster_address()
        self.node, self.driver, self.api = node, driver, api.rstrip("/")
        self.token_file, self.ca_file = token_file, ca_file
        self.refresh_seconds, self.timeout = refresh_seconds, timeout
        self._names: dict[str, str] = {}
        self._asked = -float("inf")
        self._busy = False
        self._failing = False
        self._version: str | None = None  # the version the server answered last
        self._lock = threading.Lock()
        self._first = threading.Event()

    def uuids(self, wait: float = 0.0) -> dict[str, str]:
        """Device name -> UUID from the last answer ({} before the first); asks again in a thread every
        refresh_seconds. ``wait``: seconds to wait for the very first answer."""
        now = time.monotonic()
        with self._lock:
            start = not self._busy and now - self._asked >= self.refresh_seconds
            if start:
                self._busy, self._asked = True, now
        if start:
            threading.Thread(target=self._refresh, name="gpuwarden-resourceslices", daemon=True).start()
        if wait and not self._first.is_set():
            self._first.wait(wait)
        with self._lock:
            return self._names

    def _refresh(self) -> None:
        try:
            names = self._read()
        except Exception as exc:  # noqa: BLE001 - any failure of the API keeps the last answer, logged once
            with self._lock:
                failing, self._failing = self._failing, True
            if not failing:
                log.warning("ResourceSlices unavailable, DRA devices mapped by name until they answer",
                            extra={"api": self.api, "error": str(exc)[:200]})  # fmt: skip
        else:
            with self._lock:
                self._names = names
                failing, self._failing = self._failing, False
            if failing:
                log.info("ResourceSlices answer again", extra={"api": self.api})
        finally:
            with self._lock:
                self._busy = False
            self._first.set()

    def _read(self) -> dict[str, str]:
        """One read of the node's slices: name -> UUID. Raises httpx.HTTPError, OSError (the token), ValueError (a
        bad answer)."""
        import httpx

        token = self.token_file.read_text().strip()
        verify: Any = str(self.ca_file) if self.ca_file is not None and self.api.startswith("https") else True
        selector = quote(f"spec.nodeName={self.node},spec.driver={self.driver}", safe="")
        versions = (self._version,) if self._version else VERSIONS
        with httpx.Client(timeout=self.timeout, verify=verify, headers={"Authorization": f"Bearer {token}"}) as c:
            for version in versions:
                url = f"{self.api}/apis/resource.k8s.io/{version}/resourceslices?fieldSelector={selector}"
                with c.stream("GET", url) as r:
                    if r.status_code == 404 and len(versions) > 1:
                        continue  # this server does not serve that version
                    r.raise_for_status()
                    body = bytearray()
                    for chunk in r.iter_bytes():
                        body += chunk
                        if len(body) > MAX_BYTES:
                            raise ValueError(f"an answer over {MAX_BYTES} bytes")
                self._version = version
                return device_uuids(json.loads(body), self.node, self.driver)
        raise ValueError("the API server serves no ResourceSlice version gpuwarden knows (v1, v1beta2, v1beta1)")


def device_uuids(doc: Any, node: str, driver: str) -> dict[str, str]:
    """Device name -> the ``uuid`` attribute's string, of every device in a ResourceSliceList ``doc`` whose slice is
    on ``node`` from ``driver`` (the field selector already asks for those; a server that ignored it is checked
    again). Devices without a string ``uuid`` are left out. The attributes sit on the device from v1beta2 on, under
    ``basic`` in v1beta1. Raises ValueError for a document that is not a list of slices."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a ResourceSliceList")
    out: dict[str, str] = {}
    for item in doc["items"]:
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(spec, dict) or spec.get("nodeName") != node or spec.get("driver") != driver:
            continue
        for dev in spec.get("devices") or []:
            if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
                continue
            attrs = dev.get("attributes") or (dev.get("basic") or {}).get("attributes") or {}
            uuid = attrs.get("uuid") if isinstance(attrs, dict) else None
            if isinstance(uuid, dict) and isinstance(uuid.get("string"), str):
                out[dev["name"]] = uuid["string"]
    return out
