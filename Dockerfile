# syntax=docker/dockerfile:1
# One image for both components: `vnpu-operator` (default) or `vnpu-agent` (the chart sets
# the command). This file is the image's only recipe: `docker build .` runs it, and so does
# `make image` without Docker (hack/image/build.sh runs it instruction by instruction in
# chroots, with the debian base made from Debian's packages by mmdebstrap). It refuses
# instructions and flags it does not implement, so keep to those in
# hack/image/dockerfile.py. tests/unit/release/test_dockerfile.py checks the entrypoints, the
# Python version against pyproject.toml and that the daemonless build runs this file.
#
# Reproducible: the base is pinned by digest (the multi-arch index, so amd64 and arm64
# hosts get the same release); Python packages come only from the lock files (make lock),
# by hash. For a release, name the commit and its time in the labels:
#   docker build --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(git log -1 --format=%cI) .
# and `docker buildx build --platform linux/arm64` for Kunpeng hosts (docs/IMAGE.md).
# Debian's Python (bookworm ships 3.11): the same interpreter with or without Docker.
ARG PYTHON=python3.11
# debian:bookworm-slim as published in late September 2026. The daemonless build makes
# the same suite from Debian's packages and takes the digest only as part of its cache key.
ARG BASE=debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251
ARG VERSION=0.2.0
ARG REVISION=
ARG CREATED=

FROM ${BASE} AS base
ARG PYTHON
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$PYTHON" \
 && apt-get clean && rm -rf /var/lib/apt/lists/*

# The locked dependencies, in a stage of their own: a source change reuses it. /opt/build
# holds the tools (the lock's pip, which reads pylock.toml, and the build backend);
# /opt/vnpu, the image's environment, gets no pip and nothing the lock does not name.
FROM base AS deps
ARG PYTHON
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$PYTHON-venv" \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && "$PYTHON" -m venv /opt/build \
 && "$PYTHON" -m venv --without-pip /opt/vnpu
WORKDIR /src
COPY build-requirements.txt pylock.toml ./
RUN /opt/build/bin/pip install --require-hashes -r build-requirements.txt \
 && /opt/build/bin/pip --python /opt/vnpu/bin/python install --no-compile -r pylock.toml

FROM deps AS build
COPY pyproject.toml README.md LICENSE ./
COPY common/ common/
COPY operator/ operator/
COPY node_agent/ node_agent/
COPY cli/ cli/
# The DRA plugin's gRPC modules from the vendored .proto files, with the grpcio-tools of
# build-requirements.txt (never taken from the context: .dockerignore leaves them out).
RUN /opt/build/bin/python node_agent/vnpu_agent/dra/protos/generate.py
# The project's wheel with the locked backend (no isolated build fetching another), then
# installed without resolving anything: pip check fails if the lock misses a dependency.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
 && /opt/build/bin/pip --python /opt/vnpu/bin/python install --no-compile --no-deps \
      --no-index /tmp/dist/*.whl \
 && /opt/build/bin/pip --python /opt/vnpu/bin/python check \
 && /opt/vnpu/bin/python -m compileall -q /opt/vnpu/lib

FROM base AS runtime
ARG VERSION
ARG REVISION
ARG CREATED
LABEL org.opencontainers.image.title="vnpu-operator" \
      org.opencontainers.image.description="Kubernetes operator and node agent for Huawei Ascend vNPUs" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.created="$CREATED" \
      org.opencontainers.image.source="https://github.com/vnpu-operator/vnpu-operator" \
      org.opencontainers.image.url="https://github.com/vnpu-operator/vnpu-operator" \
      org.opencontainers.image.documentation="https://github.com/vnpu-operator/vnpu-operator/blob/main/README.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="vnpu-operator maintainers" \
      io.vnpu.entrypoints="vnpu-operator vnpu-agent"
ENV PATH=/opt/vnpu/bin:$PATH \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/vnpu /opt/vnpu
# Both entrypoints must start (argument parsing and imports) in the final image.
RUN vnpu-operator --help >/dev/null && vnpu-agent --help >/dev/null \
 && groupadd --system --gid 10001 vnpu \
 && useradd --system --uid 10001 --gid vnpu --no-create-home --shell /usr/sbin/nologin vnpu
# Numeric, so that runAsNonRoot can verify it. The agent's DaemonSet overrides it (root for
# the host paths, privileged for the real drivers).
USER 10001:10001
EXPOSE 9100 9101 9443
CMD ["vnpu-operator"]
