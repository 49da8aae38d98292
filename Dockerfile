# syntax=docker/dockerfile:1
# kubeon-gpu-optimizer: one image for the webhook, extender and controller
# (`kubeon-gpu webhook|extender|controller`, see manifests/chart; `kubeon-gpu hub serve` self-hosts the hub).
#
# Base: pinned to an exact Python patch release and Debian release. Pin the
# digest too when you build (`docker buildx imagetools inspect
# python:3.11.14-slim-bookworm`) and write it after the tag as @sha256:...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- 1. build: the project's wheel plus wheels of every dependency ----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpupolicy ./gpupolicy
COPY webhook ./webhook
COPY extender ./extender
COPY controller ./controller
COPY certs ./certs
COPY serving ./serving
COPY simulator ./simulator
COPY kube ./kube
COPY cli ./cli
COPY hub ./hub
RUN python -m pip wheel --wheel-dir /wheels '.[eks,gke,aks]'

# --- 2. runtime: a venv from those wheels, no compiler, no pip in the venv ---
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/venv \
    && python -m pip --python /opt/venv/bin/python install --no-index --find-links=/wheels \
       'kubeon-gpu-optimizer[eks,gke,aks]' \
    && groupadd --gid 65532 kubeon \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kubeon
WORKDIR /tmp
USER 65532:65532
EXPOSE 8443 8888 8080
ENTRYPOINT ["kubeon-gpu"]
CMD ["--help"]
