"""Operator configuration: flags and `VNPU_*` environment variables.

Flags win over environment variables, which win over defaults. Bad values
fail at start with pydantic's message naming the setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from vnpu_common.cli import parse_settings
from vnpu_operator.placement import Policy


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VNPU_", extra="forbid")

    kubeconfig: Path | None = Field(default=None, description="Out-of-cluster kubeconfig.")
    agent_namespace: str = Field(
        default="vnpu-system", description="Namespace of the agents' Leases."
    )
    policy: Policy = Field(default=Policy.BINPACK, description="Placement policy.")
    max_attempts: int = Field(
        default=3, ge=1, le=20, description="Placements per pod whose vNPUs may fail."
    )
    lease_poll_seconds: float = Field(
        default=5.0,
        ge=0.25,
        description="How often agent Leases are listed (at most; never more than "
        "a quarter of the shortest Lease duration).",
    )
    converge_seconds: float = Field(
        default=60.0,
        ge=1,
        description="How often the caches are checked against the server for deletions "
        "no watch event reported (after an API server restart, say).",
    )
    lease_grace_seconds: float = Field(
        default=5.0, ge=0, description="Slack past a Lease's expiry before its node is not live."
    )

    webhook_host: str = "0.0.0.0"
    webhook_port: int = Field(default=9443, ge=1, le=65535)
    webhook_cert_dir: Path | None = Field(
        default=None,
        description="Directory with tls.crt, tls.key (and ca.crt) for the webhook; "
        "unset: a self-signed CA and certificate are generated at start.",
    )
    webhook_url: str = Field(
        default="",
        description="Register the webhooks with this https base URL (local planes).",
    )
    webhook_service: str = Field(
        default="",
        description="Register the webhooks with this Service, namespace/name[:port].",
    )
    webhook_dns_names: list[str] = Field(
        default_factory=list, description="Extra DNS names for a self-signed certificate."
    )
    webhook_cert_validity_seconds: float = Field(
        default=365 * 86400,
        ge=10,
        description="Lifetime of the self-signed serving certificate; a new one is served "
        "once webhook_cert_renew_fraction of it has passed.",
    )
    webhook_ca_validity_seconds: float = Field(
        default=3650 * 86400,
        ge=20,
        description="Lifetime of the self-signed CA, at least twice the certificate's; "
        "renewed likewise, its CA bundle registered before a certificate it signed is served.",
    )
    webhook_cert_renew_fraction: float = Field(
        default=2 / 3,
        ge=0.1,
        le=0.9,
        description="Part of a self-signed certificate's (and CA's) lifetime after which "
        "it is renewed.",
    )
    webhook_cert_poll_seconds: float = Field(
        default=5.0,
        ge=0.1,
        description="How often webhook_cert_dir is read for replaced files and the "
        "self-signed certificate checked for renewal.",
    )
    runtime_class_name: str = Field(
        default="",
        description="RuntimeClass the mutating webhook sets on vNPU pods that name none "
        "(e.g. one whose handler is Ascend Docker Runtime); empty: pods are left as they are.",
    )

    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(default=9100, ge=0, le=65535)
    watch_timeout_seconds: int = Field(
        default=300, ge=10, description="Server-side watch timeout; streams are then resumed."
    )
    retry_max_seconds: float = Field(default=30.0, gt=0, description="API error backoff ceiling.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _check(self) -> OperatorSettings:
        if self.webhook_url and self.webhook_service:
            raise ValueError("give webhook_url or webhook_service, not both")
        if self.webhook_service and "/" not in self.webhook_service:
            raise ValueError("webhook_service must be namespace/name[:port]")
        return self

    @model_validator(mode="after")
    def _check_cert_lifetimes(self) -> OperatorSettings:
        # A CA barely outliving its certificate would cut each new certificate short.
        if self.webhook_ca_validity_seconds < 2 * self.webhook_cert_validity_seconds:
            raise ValueError(
                "webhook_ca_validity_seconds must be at least twice webhook_cert_validity_seconds"
            )
        return self


def parse_args(argv: Sequence[str] | None = None) -> OperatorSettings:
    """Settings from flags over environment; exits with a clear message on bad values."""
    return parse_settings(
        OperatorSettings,
        argv,
        prog="vnpu-operator",
        description="vnpu-operator cluster operator",
        list_fields=("webhook_dns_names",),
    )
