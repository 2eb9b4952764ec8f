# syntax=docker/dockerfile:1
# The gpu_ops user-code image: the Dagster gRPC code server (helm/gpu-ops) and the run
# workers the K8sRunLauncher starts from it (it hands them DAGSTER_CURRENT_IMAGE).
#
#   docker build -t REGISTRY/gpu-ops:0.1.0 .                         # orchestration only
#   docker build --build-arg EXTRAS=train -t REGISTRY/gpu-ops:0.1.0-train .
#
# EXTRAS=train adds torch==2.13.0 (the `train` extra), needed only when training code
# runs inside the run worker (the local backend, or the demo asset). With the kubetorch
# backend the GPU work runs in the Kubetorch workload's own image, and the lean image
# keeps run-worker pods fast to pull. TORCH_INDEX_URL picks the torch build, e.g.
# https://download.pytorch.org/whl/cpu for a CPU-only image.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=""
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_ops ./gpu_ops
# A regular (non-editable) install: the source tree is not copied into the final image.
# pip compiles bytecode at install time, which matters because the root filesystem is
# read-only at runtime and PYTHONDONTWRITEBYTECODE is set.
RUN pip install --upgrade pip \
 && if [ -n "$EXTRAS" ]; then \
        pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} ".[${EXTRAS}]"; \
    else \
        pip install .; \
    fi \
 && pip check

FROM ${PYTHON_IMAGE}
# A fixed numeric UID/GID: Kubernetes can only verify runAsNonRoot for a numeric USER,
# and the chart's securityContext (runAsUser 10001) matches it.
RUN groupadd --gid 10001 gpuops \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gpuops \
 && mkdir -p /var/lib/gpu-ops /opt/dagster/dagster_home \
 && chown 10001:10001 /var/lib/gpu-ops /opt/dagster/dagster_home
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    GPU_OPS_HOME=/var/lib/gpu-ops \
    DAGSTER_HOME=/opt/dagster/dagster_home
WORKDIR /opt/gpu-ops
# workspace.yaml for `dagster dev`-style local checks inside the image; the production
# instance (deploy/dagster.yaml, or the one the Dagster chart generates) is mounted into DAGSTER_HOME.
COPY workspace.yaml ./
USER 10001:10001
EXPOSE 3030
CMD ["dagster", "api", "grpc", "--module-name", "gpu_ops.definitions", "--attribute", "defs", "--host", "0.0.0.0", "--port", "3030"]
