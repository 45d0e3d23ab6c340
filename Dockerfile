# syntax=docker/dockerfile:1
# gpuwarden container image: docker build -t gpuwarden . ; run it with the NVIDIA container toolkit:
#   docker run --rm --runtime=nvidia --pid=host -p 10400:10400 gpuwarden
# (--gpus all works too). Kubernetes: deploy/kubernetes/, docs/deploy.md.

FROM python:3.12-slim AS build
WORKDIR /src
# Only what the wheel needs (pyproject names README.md as the long description).
COPY pyproject.toml README.md ./
COPY gpuwarden ./gpuwarden
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
LABEL org.opencontainers.image.title="gpuwarden" \
      org.opencontainers.image.description="Per-node NVIDIA GPU monitoring daemon and Prometheus exporter" \
      org.opencontainers.image.licenses="Apache-2.0"
# The NVIDIA runtime mounts libnvidia-ml.so (and nvidia-smi) for the "utility" capability only; no CUDA.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl
# Non-root, numeric (so Kubernetes' runAsNonRoot can check it without /etc/passwd).
USER 10001:10001
EXPOSE 10400
ENTRYPOINT ["gpuwarden", "serve"]
