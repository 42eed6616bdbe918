"""Operator configuration: flags and `VNPU_*` environment variables.

Flags win over environment variables, which win over defaults. Bad values
fail at start with pydantic's message naming the setting.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import CliSuppress, NoDecode

from vnpu_common.process.flags import parse_settings
from vnpu_common.process.settings import ComponentSettings, MetricsPort
from vnpu_operator.election import Timing
from vnpu_operator.placement import Policy

# The choices as an admin types them; pydantic-settings would show the enum's
# member names (BINPACK), which VNPU_POLICY does not accept.
PolicyName = Literal["binpack", "spread", "bestfit"]


class OperatorSettings(ComponentSettings):
    """The operator's settings; those the agent has too are in ComponentSettings."""

    policy: PolicyName = Field(
        default="binpack",
        description="Placement: binpack fills the fullest chip that fits, spread the emptiest, "
        "bestfit the one that keeps most room for the largest templates (docs/USAGE.md, "
        "'Placement policies').",
    )
    dra: bool = Field(
        default=True,
        description="Serve ResourceClaims of driver vnpu.io (docs/DRA.md): a VNPUAllocation per "
        "allocated device, the binding conditions in the claim's status. Needs the API server "
        "to serve resource.k8s.io/v1; without it the operator says so once and goes on.",
    )
    dra_extended_resources: bool = Field(
        default=True,
        description="DRA nodes serve a pod's limits: {vnpu.io/<template>: N} through the "
        "DeviceClass per template the chart makes (dra.extendedResources): the webhook leaves "
        "such a pod to the scheduler when a DRA node offers the template. Off, or with --dra "
        "off: every such pod goes the annotation path (docs/USAGE.md, 'One request').",
    )
    dra_node_selector: Annotated[dict[str, str], NoDecode] = Field(
        default={},
        description="Labels of the DRA nodes where a cluster has both kinds "
        "(key=value,key2=value2; the chart's agent.draNodeSelector): a vnpu.io/<template> "
        "pod served by DRA gets them in its nodeSelector, so it never lands on an annotation "
        "node, which lists vnpu.io/<template> in its capacity.",
    )
    preemption: bool = Field(
        default=False,
        description="Let a waiting vNPU pod evict running vNPU pods of lower priority "
        "(their PriorityClass) on one node to make room, through the Eviction API "
        "(PodDisruptionBudgets hold). Off by default: it kills running workloads.",
    )
    max_attempts: int = Field(
        default=3, ge=1, le=20, description="Placements per pod whose vNPUs may fail."
    )
    # Deprecated, goes in the next release: agent Leases are watched now (leases.py).
    lease_poll_seconds: float | None = Field(
        default=None,
        ge=0.25,
        description="Ignored: agent Leases are watched. Deprecated, goes in the next release.",
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

    leader_election: bool = Field(
        default=True,
        description="Run for leadership with a coordination.k8s.io Lease: every replica keeps "
        "its caches and serves the webhook, only the leader places, releases and writes "
        "(docs/HELM.md, 'High availability'). Off: this replica always leads; never run two so.",
    )
    leader_election_namespace: str = Field(
        default="", description="Namespace of the leader Lease; empty: the agent namespace."
    )
    leader_election_identity: str = Field(
        default="",
        description="This replica's name in the leader Lease (the chart: the pod's name); "
        "empty: <hostname>-<pid>.",
    )
    leader_election_lease_seconds: int = Field(
        default=4,
        ge=2,
        description="How long the leader Lease outlives its last renewal: a standby takes "
        "over this long after the leader died without handing it back.",
    )
    leader_election_renew_deadline_seconds: float = Field(
        default=3.0,
        gt=0,
        description="A leader whose last successful renewal is older than this stops writing "
        "(shorter than the lease, so it stops before anyone can take over).",
    )
    leader_election_retry_seconds: float = Field(
        default=0.5, gt=0, description="How often the leader renews and a standby tries."
    )

    webhook_host: str = Field(default="0.0.0.0", description="Address the webhook listens on.")
    webhook_port: int = Field(
        default=9443, ge=1, le=65535, description="HTTPS port the webhook listens on."
    )
    webhook_cert_dir: Path | None = Field(
        default=None,
        description="Directory with tls.crt, tls.key (and ca.crt) for the webhook, served "
        "anew when its files change; unset: the operator makes its own CA and certificate "
        "and renews them.",
    )
    # Developer flag: a local plane's API server reaches the webhook by URL;
    # in a cluster it is always a Service.
    webhook_url: CliSuppress[str] = Field(
        default="",
        description="Register the webhooks with this https base URL (local planes).",
    )
    webhook_service: str = Field(
        default="",
        description="Register the webhooks with this Service, namespace/name[:port].",
    )
    webhook_dns_names: Annotated[list[str], NoDecode] = Field(
        default=[], description="Extra DNS names for a self-signed certificate, comma-separated."
    )
    webhook_cert_validity_seconds: float = Field(
        default=365 * 86400,
        ge=10,
        description="Lifetime of the self-signed serving certificate; a new one is served "
        "once the renew fraction of it has passed.",
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
        description="How often the certificate directory is read for replaced files and the "
        "self-signed certificate checked for renewal.",
    )
    webhook_drain_seconds: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="After SIGTERM, how long the webhook answers on (not Ready, each answer "
        "closing its connection) before it stops, so that no admission the API server sends "
        "on a kept-alive connection meets the close.",
    )
    runtime_class_name: str = Field(
        default="",
        description="RuntimeClass the mutating webhook sets on vNPU pods that name none "
        "(e.g. one whose handler is Ascend Docker Runtime); empty: pods are left as they are.",
    )

    metrics_port: MetricsPort = 9100
    watch_timeout_seconds: int = Field(
        default=300, ge=10, description="Server-side watch timeout; streams are then resumed."
    )
    retry_max_seconds: float = Field(default=30.0, gt=0, description="API error backoff ceiling.")

    @field_validator("webhook_dns_names", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [n.strip() for n in value.split(",") if n.strip()]
        return value

    @field_validator("dra_node_selector", mode="before")
    @classmethod
    def _split_selector(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        out: dict[str, str] = {}
        for entry in (e.strip() for e in value.split(",")):
            if not entry:
                continue
            key, sep, label = entry.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--dra-node-selector: {entry!r} is not key=value")
            out[key.strip()] = label.strip()
        return out

    @property
    def placement_policy(self) -> Policy:
        return Policy(self.policy)

    @model_validator(mode="after")
    def _check(self) -> OperatorSettings:
        if self.webhook_url and self.webhook_service:
            raise ValueError("give --webhook-url or --webhook-service, not both")
        if self.webhook_service and "/" not in self.webhook_service:
            raise ValueError(
                "--webhook-service (VNPU_WEBHOOK_SERVICE) must be namespace/name[:port], "
                f"not {self.webhook_service!r}"
            )
        return self

    @model_validator(mode="after")
    def _check_leader_timing(self) -> OperatorSettings:
        self.election_timing()
        return self

    def deprecations(self) -> list[str]:
        """What the admin should change, for a warning at start."""
        if self.lease_poll_seconds is None:
            return []
        return [
            "--lease-poll-seconds / VNPU_LEASE_POLL_SECONDS is ignored (agent Leases are "
            "watched) and goes in the next release: remove it"
        ]

    def election_timing(self) -> Timing:
        return Timing(
            lease_seconds=self.leader_election_lease_seconds,
            renew_deadline=self.leader_election_renew_deadline_seconds,
            retry_seconds=self.leader_election_retry_seconds,
        )

    def election_identity(self) -> str:
        return self.leader_election_identity or f"{socket.gethostname()}-{os.getpid()}"

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
        description="The vnpu-operator cluster operator: admission webhooks, vNPU "
        "placement and the VNPUAllocation lifecycle.",
    )
