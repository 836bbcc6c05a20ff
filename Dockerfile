# syntax=docker/dockerfile:1
# oms-mpijob-proxy: a reverse proxy in front of OpenM++ oms that runs MPI model runs as MPIJobs.
#
#   docker build -t oms-mpijob-proxy .
#   docker run --rm -p 8080:8080 -v "$PWD/config/deploy:/etc/oms-mpijob-proxy:ro" oms-mpijob-proxy
#
# Both stages must use the same base image: the virtual environment's interpreter is a symlink
# to the base image's /usr/local/bin/python3.11. Override the tag with --build-arg; pin a digest
# (python:3.11.13-slim-bookworm@sha256:...) in your own CI for fully reproducible builds.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- build: a virtual environment holding the package and its dependencies -------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

# The venv gets no pip of its own: the base image's pip installs into it (--python), so
# neither pip nor a pip cache reaches the final image.
RUN python -m venv --without-pip /opt/venv

WORKDIR /src
# README* and LICENSE* are optional: the glob copies them when present.
COPY pyproject.toml README* LICENSE* ./
COPY proxy ./proxy
RUN python -m pip --python /opt/venv/bin/python install --no-cache-dir . \
    && /opt/venv/bin/python -c "import proxy.cli"

# --- runtime: the slim base, the venv and an unprivileged user -------------------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="oms-mpijob-proxy" \
      org.opencontainers.image.description="Reverse proxy in front of OpenM++ oms that runs MPI model runs as Kubeflow MPIJobs" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH

# A fixed numeric user (no login shell, no home) so runAsUser/runAsNonRoot can be checked
# by the kubelet; the Kubernetes manifests use the same 10001.
RUN groupadd --system --gid 10001 proxy \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin proxy

# Owned by root and read-only for the proxy user (the pod also sets readOnlyRootFilesystem).
COPY --from=build /opt/venv /opt/venv

USER 10001:10001
EXPOSE 8080

# For docker/compose only (Kubernetes ignores HEALTHCHECK and uses the pod's probes).
# The slim image has no curl; urlopen raises on a refused connection or a non-2xx answer.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]

# The configuration (proxy.yaml and the MPIJob template next to it) is mounted, never baked in.
ENTRYPOINT ["oms-mpijob-proxy", "serve"]
CMD ["--config", "/etc/oms-mpijob-proxy/proxy.yaml"]
