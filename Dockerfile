# syntax=docker/dockerfile:1
# One image for both components: `vnpu-operator` (default) or `vnpu-agent` (the chart sets
# the command). tests/unit/test_dockerfile.py checks the entrypoints and the Python version
# against pyproject.toml.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/vnpu
COPY pyproject.toml README.md ./
COPY common/ common/
COPY operator/ operator/
COPY node_agent/ node_agent/
RUN /opt/vnpu/bin/pip install --no-compile . \
 && /opt/vnpu/bin/python -m compileall -q /opt/vnpu/lib

FROM python:${PYTHON_VERSION}-slim AS runtime
LABEL org.opencontainers.image.title="vnpu-operator" \
      org.opencontainers.image.description="vnpu-operator cluster operator and node agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.vnpu.entrypoints="vnpu-operator vnpu-agent"
ENV PATH=/opt/vnpu/bin:$PATH \
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
