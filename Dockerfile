# syntax=docker/dockerfile:1
# gpuwarden container image: docker build -t gpuwarden . ; run it with the NVIDIA container toolkit:
#   docker run --rm --runtime=nvidia --pid=host -p 10400:10400 gpuwarden
# (--gpus all works too; without a GPU: docker run --rm -p 10400:10400 gpuwarden --demo). Kubernetes:
# deploy/kubernetes/, docs/deploy.md.

FROM python:3.12-slim AS build
WORKDIR /src
# Only what the wheel needs (pyproject names README.md as the long description).
COPY pyproject.toml README.md ./
COPY gpuwarden ./gpuwarden
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
LABEL org.opencontainers.image.title="gpuwarden" \
      org.opencontainers.image.description="Per-node NVIDIA GPU monitoring daemon and Prometheus exporter" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpuwarden/gpuwarden" \
      org.opencontainers.image.documentation="https://github.com/gpuwarden/gpuwarden/blob/main/docs/deploy.md"
# The NVIDIA runtime mounts libnvidia-ml.so (and nvidia-smi) for the "utility" capability only; no CUDA.
# GPUWARDEN_LISTEN_ADDRESS: every interface of the container's own network namespace, so that `-p` reaches the
# daemon, the demo's too (outside a container the demo binds 127.0.0.1 unless given an address).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    GPUWARDEN_LISTEN_ADDRESS=0.0.0.0:10400
# The layout of the Debian package's image (tools/package_image.py, docs/deploy.md): a virtual environment in
# /opt/gpuwarden holding the dependencies at the versions and hashes of requirements.lock (pip-compile
# --generate-hashes: docs/deploy.md), then gpuwarden's own wheel without resolving anything more; /usr/bin/gpuwarden.
COPY requirements.lock /tmp/requirements.lock
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m venv --without-pip /opt/gpuwarden \
    && pip --python /opt/gpuwarden/bin/python install --no-cache-dir --require-hashes -r /tmp/requirements.lock \
    && pip --python /opt/gpuwarden/bin/python install --no-cache-dir --no-deps /wheels/*.whl \
    && ln -s /opt/gpuwarden/bin/gpuwarden /usr/bin/gpuwarden \
    && rm /tmp/requirements.lock
# Non-root, numeric (so Kubernetes' runAsNonRoot can check it without /etc/passwd).
USER 10001:10001
EXPOSE 10400
ENTRYPOINT ["/usr/bin/gpuwarden", "serve"]
