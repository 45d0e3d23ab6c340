"""Where the Kubernetes API server is from inside a pod: the service account's files and the in-cluster address."""

from __future__ import annotations

import os
from pathlib import Path

#: The service account's files, as Kubernetes mounts them (``token``, ``ca.crt``).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_address() -> str:
    """``https://HOST:PORT`` of the API server from ``KUBERNETES_SERVICE_HOST``/``_PORT`` (an IPv6 host bracketed).
    Raises ValueError when they are not set (not in a Kubernetes pod)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST/_PORT are not set")
    return f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
