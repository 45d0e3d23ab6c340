"""Whether this node's default name (its host name) survives a re-create of the daemon's container.

``gpu_devices{nodename}`` is what GpuMissing compares over a day: a name that changes when the container is
re-created (Docker and Podman name a container's host after its id; Kubernetes a pod's after the pod) hides every
missing GPU and pages nobody. The daemon refuses to read real GPUs under such a name unless ``node_name``
(``GPUWARDEN_NODE_NAME``) is set; a replay or the demo does not need one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_CONTAINER_ID = re.compile(r"containers/([0-9a-f]{64})/")  # docker: containers/ID/, podman: overlay-containers/ID/


def unstable_name(hostname: str, environ: Mapping[str, str], mountinfo: str) -> str | None:
    """Return why ``hostname`` is no stable node name (one sentence), or None when it is.

    Unstable: a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` set: the host name is the pod's name), or a container
    whose host name is the start of its own id (Docker and Podman bind-mount ``/etc/hostname`` from
    ``.../containers/<64-hex id>/``, as ``/proc/self/mountinfo`` shows). ``--uts=host`` or ``hostNetwork`` give the
    node's own name, which is stable.
    """
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return (
            f"this pod's host name {hostname!r} is new at every re-create of the pod: set GPUWARDEN_NODE_NAME "
            "from the downward API (spec.nodeName), as deploy/kubernetes/daemonset.yaml does"
        )
    name = hostname.lower()
    if re.fullmatch(r"[0-9a-f]{12,64}", name) and any(cid.startswith(name) for cid in _CONTAINER_ID.findall(mountinfo)):
        return (
            f"this container's host name {hostname!r} is its container id, new at every re-create: set "
            "GPUWARDEN_NODE_NAME to the node's name (docker run -e GPUWARDEN_NODE_NAME=$(hostname) ...) or run with "
            "--uts=host"
        )
    return None
