"""The settings both commands have, written once: what `--help` shows for
them, their flags, `VNPU_*` variables and defaults. `OperatorSettings` and
`AgentSettings` extend `ComponentSettings` (their flags come first in
`--help`).

Each component sets its own port of /metrics (`metrics_port: MetricsPort =
...`); the watch timeout and the backoff ceiling stay in each component, as
they mean a different thing there (the operator resumes a stream, the agent
re-lists).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from vnpu_common.process.logs import LogFormat, LogLevel

MetricsPort = Annotated[
    int, Field(ge=0, le=65535, description="Port of /metrics, /healthz and /readyz; 0: none.")
]


class ComponentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VNPU_", extra="forbid")

    kubeconfig: Path | None = Field(default=None, description="Out-of-cluster kubeconfig.")
    agent_namespace: str = Field(
        default="vnpu-system",
        description="Namespace the node agents run in and keep their Leases "
        "(the chart's release namespace).",
    )
    metrics_host: str = Field(
        default="0.0.0.0", description="Address of the /metrics, /healthz and /readyz port."
    )
    # Each component gives its own default.
    metrics_port: MetricsPort
    metrics_auth: Literal["none", "kubernetes"] = Field(
        default="none",
        description="kubernetes: /metrics over TLS, only for a bearer token the API server "
        "lets get /metrics (TokenReview, SubjectAccessReview); none: plain HTTP, no check.",
    )
    probe_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Also serve /healthz and /readyz in plain HTTP on every address at this "
        "port (for a /metrics port on localhost or behind a token); 0: none.",
    )
    metrics_pod_names: bool = Field(
        default=True,
        description="Name tenants' pods and allocations in series labels; false: those "
        "labels are empty (namespaces stay), for a Prometheus that tenants read.",
    )
    log_level: LogLevel = Field(default="INFO", description="Least severe level logged.")
    log_format: LogFormat = Field(
        default="text", description="text lines, or one JSON object per line for a log collector."
    )
