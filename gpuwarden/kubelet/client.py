"""The kubelet's pod-resources API over its unix socket: which pods' containers hold which GPU devices.

``PodResources.assign(gpus)`` puts each GPU's containers in ``GpuReading.pods``. The kubelet serves ``List`` on
``/var/lib/kubelet/pod-resources/kubelet.sock`` (gRPC, package ``v1``, service ``PodResourcesLister``); the socket is
root-only on most kubelets. The answer is cached for ``refresh_seconds``; when the kubelet restarts, gRPC reconnects to
the new socket by itself, and meanwhile the last answer is used for up to ``max_age_seconds``.

Device ids are the NVIDIA device plugin's: a GPU UUID (``GPU-...``), ``GPU-...::N`` for time-slicing replicas (several
pods on one GPU), a MIG device UUID (``MIG-...``), or the GPU index with ``deviceIDStrategy=index``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from gpuwarden.kubelet.resourceslices import DraDevices
from gpuwarden.model import GpuReading, PodAssignment

log = logging.getLogger("gpuwarden.kubelet")

#: Where the kubelet serves the pod-resources API.
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: Extended resources of NVIDIA's device plugin (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb, ...).
RESOURCE_PREFIX = "nvidia.com/"
#: The driver name of NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): its devices are named gpu-<index> and
#: gpu-<index>-mig-... in the claim's allocation (ClaimResource.device_name).
DRA_DRIVER = "gpu.nvidia.com"
_METHOD = "/v1.PodResourcesLister/List"


class PodResources:
    """Client of the kubelet's pod-resources ``List``; raises ImportError at construction when grpcio is missing
    (``pip install 'gpuwarden[kubelet]'``). Never raises from ``assignments``/``assign``: an unreachable kubelet is
    logged once per outage and leaves the pods unknown (empty) once the last answer is older than max_age_seconds.
    ``List`` runs in gRPC's threads, within ``timeout`` seconds; callers read the last answer."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout: float = 2.0, refresh_seconds: float = 5.0,
                 max_age_seconds: float = 60.0, dra: DraDevices | None = None) -> None:  # fmt: skip
        import grpc

        from gpuwarden.kubelet import podresources_pb2 as pb

        self.socket = socket
        self.dra = dra
        self.timeout = timeout
        self.refresh_seconds = refresh_seconds
        self.max_age_seconds = max_age_seconds
        self._pb = pb
        self._grpc = grpc
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._list: Any = self._channel.unary_unary(
            _METHOD,
            request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString,
        )
        self._cached: list[PodAssignment] = []
        self._at = -float("inf")  # monotonic time of the last good answer
        self._asked = -float("inf")
        self._failing = False
        self._call: Any = None  # the List in flight
        self._first = threading.Event()  # the first List has answered (or failed)
        self._lock = threading.Lock()
        self._closed = False

    def assignments(self) -> list[PodAssignment]:
        """Every container's NVIDIA devices, from the last ``List`` answer (empty once it is older than
        max_age_seconds). A new ``List`` is asked at most every refresh_seconds, in the background: the caller (the
        poll thread) never waits on the kubelet, but for the very first answer, at most ``timeout`` seconds, so
        that the first polls know their pods. A kubelet that accepts and never answers costs that once."""
        now = time.monotonic()
        call = None
        with self._lock:
            if self._call is None and now - self._asked >= self.refresh_seconds:
                self._asked = now
                call = self._call = self._list.future(
                    self._pb.ListPodResourcesRequest(), timeout=self.timeout, wait_for_ready=False
                )
        if call is not None:
            call.add_done_callback(self._answered)  # runs at once when the answer is already there
        if not self._first.is_set():
            self._first.wait(self.timeout)
        with self._lock:
            return self._cached if time.monotonic() - self._at <= self.max_age_seconds else []

    def _answered(self, call: Any) -> None:
        """Take ``List``'s answer (gRPC's thread): cache it, or log the start and the end of an outage once."""
        try:
            resp = call.result()
        except self._grpc.RpcError as exc:
            with self._lock:
                self._call = None
                failing, self._failing = self._failing, True
            if not failing and not self._closed:
                log.warning("kubelet pod-resources unavailable, pods unknown until it answers",
                            extra={"socket": str(self.socket), "error": _code(exc)})  # fmt: skip
            self._first.set()
            return
        found = [
            PodAssignment(
                namespace=pod.namespace, pod=pod.name, container=c.name, device_id=dev_id, resource=dev.resource_name
            )  # fmt: skip
            for pod in resp.pod_resources
            for c in pod.containers
            for dev in c.devices
            if dev.resource_name.startswith(RESOURCE_PREFIX)
            for dev_id in dev.device_ids
        ] + [
            # Dynamic Resource Allocation: a ResourceClaim's devices from NVIDIA's DRA driver
            PodAssignment(
                namespace=pod.namespace,
                pod=pod.name,
                container=c.name,
                device_id=res.device_name,
                resource=f"{res.driver_name}/{claim.claim_namespace}/{claim.claim_name}",
            )  # fmt: skip
            for pod in resp.pod_resources
            for c in pod.containers
            for claim in c.dynamic_resources
            for res in claim.claim_resources
            if res.driver_name == DRA_DRIVER and res.device_name
        ]
        with self._lock:
            self._call = None
            failing, self._failing = self._failing, False
            self._cached, self._at = found, time.monotonic()
        if failing:
            log.info("kubelet pod-resources answers again", extra={"socket": str(self.socket)})
        self._first.set()

    def assign(self, gpus: list[GpuReading]) -> list[GpuReading]:
        """``gpus`` with ``pods`` set: the containers whose device ids name the GPU (its UUID, a replica of it, one of
        its MIG devices, or its index). A DRA device is the GPU whose UUID (or MIG device's) the node's ResourceSlice
        gives its name (``dra``); a name the slices do not list (none read yet, or none asked) is taken as the
        driver's ``gpu-N`` / ``gpu-N-mig-...`` for NVML index N."""
        found = self.assignments()
        if not found:
            return gpus
        uuids = self.dra.uuids(wait=self.timeout) if self.dra is not None else {}
        out = []
        for g in gpus:
            dra = f"gpu-{g.index}"  # the DRA driver's device names: gpu-N, and gpu-N-mig-... for its MIG devices
            names = {g.uuid, str(g.index), *(m.uuid for m in g.mig)}
            pods = [a for a in found if _names_gpu(a, names, dra, uuids)]
            out.append(g.model_copy(update={"pods": pods}) if pods else g)
        return out

    def close(self) -> None:
        """Close the gRPC channel (a List in flight ends, unlogged)."""
        self._closed = True
        self._channel.close()


def _names_gpu(a: PodAssignment, names: set[str], dra: str, uuids: dict[str, str]) -> bool:
    """Whether assignment ``a`` names the GPU of ``names`` (its UUID, index, MIG UUIDs) and DRA name ``dra``."""
    if a.resource.startswith(DRA_DRIVER + "/"):
        if a.device_id in uuids:
            return uuids[a.device_id] in names
        return a.device_id == dra or a.device_id.startswith(dra + "-mig-")
    return a.device_id.split("::", 1)[0] in names


def _code(exc: Any) -> str:
    code = getattr(exc, "code", None)
    return str(code().name) if callable(code) else type(exc).__name__
