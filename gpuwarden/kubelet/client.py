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
import time
from pathlib import Path
from typing import Any

from gpuwarden.model import GpuReading, PodAssignment

log = logging.getLogger("gpuwarden.kubelet")

#: Where the kubelet serves the pod-resources API.
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: Extended resources of NVIDIA's device plugin (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb, ...).
RESOURCE_PREFIX = "nvidia.com/"
_METHOD = "/v1.PodResourcesLister/List"


class PodResources:
    """Client of the kubelet's pod-resources ``List``; raises ImportError at construction when grpcio is missing
    (``pip install 'gpuwarden[kubelet]'``). Never raises from ``assignments``/``assign``: an unreachable kubelet is
    logged once per outage and leaves the pods unknown (empty) once the last answer is older than max_age_seconds."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout: float = 2.0, refresh_seconds: float = 5.0,
                 max_age_seconds: float = 60.0) -> None:  # fmt: skip
        import grpc

        from gpuwarden.kubelet import podresources_pb2 as pb

        self.socket = socket
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

    def assignments(self) -> list[PodAssignment]:
        """Every container's NVIDIA devices, from a fresh ``List`` at most every refresh_seconds."""
        now = time.monotonic()
        if now - self._asked < self.refresh_seconds:
            return self._cached if now - self._at <= self.max_age_seconds else []
        self._asked = now
        try:
            resp = self._list(self._pb.ListPodResourcesRequest(), timeout=self.timeout, wait_for_ready=False)
        except self._grpc.RpcError as exc:
            if not self._failing:
                log.warning("kubelet pod-resources unavailable, pods unknown until it answers",
                            extra={"socket": str(self.socket), "error": _code(exc)})  # fmt: skip
            self._failing = True
            return self._cached if now - self._at <= self.max_age_seconds else []
        if self._failing:
            log.info("kubelet pod-resources answers again", extra={"socket": str(self.socket)})
        self._failing = False
        self._cached = [
            PodAssignment(
                namespace=pod.namespace, pod=pod.name, container=c.name, device_id=dev_id, resource=dev.resource_name
            )  # fmt: skip
            for pod in resp.pod_resources
            for c in pod.containers
            for dev in c.devices
            if dev.resource_name.startswith(RESOURCE_PREFIX)
            for dev_id in dev.device_ids
        ]
        self._at = now
        return self._cached

    def assign(self, gpus: list[GpuReading]) -> list[GpuReading]:
        """``gpus`` with ``pods`` set: the containers whose device ids name the GPU (its UUID, a replica of it, one of
        its MIG devices, or its index)."""
        found = self.assignments()
        if not found:
            return gpus
        out = []
        for g in gpus:
            names = {g.uuid, str(g.index), *(m.uuid for m in g.mig)}
            pods = [a for a in found if a.device_id.split("::", 1)[0] in names]
            out.append(g.model_copy(update={"pods": pods}) if pods else g)
        return out

    def close(self) -> None:
        """Close the gRPC channel."""
        self._channel.close()


def _code(exc: Any) -> str:
    code = getattr(exc, "code", None)
    return str(code().name) if callable(code) else type(exc).__name__
