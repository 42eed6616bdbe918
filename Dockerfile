# syntax=docker/dockerfile:1
# One image for both components: `vnpu-operator` (default) or `vnpu-agent` (the chart sets
# the command). This file is the image's only recipe: `docker build .` runs it, and so does
# `make image` without Docker (hack/image/build.sh runs it instruction by instruction in
# chroots, with the debian base made from Debian's packages by mmdebstrap). It refuses
# instructions and flags it does not implement, so keep to those in
# hack/image/dockerfile.py. tests/unit/test_dockerfile.py checks the entrypoints, the
# Python version against pyproject.toml and that the daemonless build runs this file.
ARG DEBIAN_RELEASE=bookworm
# Debian's Python (bookworm ships 3.11): the same interpreter with or without Docker.
ARG PYTHON=python3.11

FROM debian:${DEBIAN_RELEASE}-slim AS base
ARG PYTHON
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$PYTHON" \
 && apt-get clean && rm -rf /var/lib/apt/lists/*

FROM base AS build
ARG PYTHON
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$PYTHON-venv" \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && "$PYTHON" -m venv /opt/vnpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common/ common/
COPY operator/ operator/
COPY node_agent/ node_agent/
COPY cli/ cli/
RUN /opt/vnpu/bin/pip install --no-compile . \
 && /opt/vnpu/bin/python -m compileall -q /opt/vnpu/lib

FROM base AS runtime
LABEL org.opencontainers.image.title="vnpu-operator" \
      org.opencontainers.image.description="vnpu-operator cluster operator and node agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
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
