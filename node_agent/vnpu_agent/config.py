"""Agent configuration: flags and `VNPU_*` environment variables.

Flags win over environment variables, which win over defaults. Bad values
fail at start with pydantic's message naming the setting, never later.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import CliSuppress, NoDecode

from vnpu_agent.drivers.backends import DriverKind
from vnpu_common.process.flags import parse_settings
from vnpu_common.process.settings import ComponentSettings, MetricsPort

ForeignPolicy = Literal["keep", "collect"]


class AgentSettings(ComponentSettings):
    """The agent's settings; those the operator has too are in ComponentSettings."""

    node_name: str = Field(
        default="",
        description="Node this agent serves (from the downward API in the DaemonSet).",
    )
    # Developer flag: the demo and the benchmarks serve many kwok nodes from
    # one process; a DaemonSet's agent serves its own node.
    simulate_nodes: CliSuppress[Annotated[list[str], NoDecode]] = Field(
        default=[],
        description="Serve several simulated nodes in one process (sim driver only).",
    )
    # The chart's default (agent.driver); --simulate-nodes without --driver means sim.
    driver: DriverKind = Field(
        default="dcmi",
        description="How vNPUs are made: dcmi (the driver's libdcmi; the default, as in the "
        "chart), npu-smi (the npu-smi tool) or sim (simulated chips, no NPU; the default "
        "with --simulate-nodes).",
    )
    # The old name of agent_namespace, kept for one release (docs/DECISIONS.md).
    namespace: CliSuppress[str | None] = Field(
        default=None, description="Deprecated: use --agent-namespace."
    )
    state_dir: Path = Field(
        default=Path("/var/lib/vnpu-agent"),
        description="Agent state: vNPUs it created; sim driver state.",
    )
    cdi_dir: Path = Field(default=Path("/var/run/cdi"), description="Where CDI specs go.")
    cdi_host_device_dir: Path = Field(
        default=Path("/dev"),
        description="Host directory the CDI specs' device nodes come from: vdavinci<id>, "
        "davinci_manager, devmm_svm, hisi_hdc (/dev on an Ascend host). The runtime stats "
        "them when it injects a device, so they must exist there; with the sim driver on a "
        "real node, point it at --sim-device-dir.",
    )
    dra_plugins_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins"),
        description="--dra: the kubelet's plugins directory; the DRA plugin's socket is "
        "<dir>/vnpu.io/dra[-<pod uid>].sock, the same path in the container as on the host.",
    )
    dra_registry_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        description="--dra: the kubelet's plugin registration directory; the plugin "
        "registers through <dir>/vnpu.io[-<pod uid>]-reg.sock.",
    )
    pod_uid: str = Field(
        default="",
        description="The agent pod's UID (downward API): with --dra, part of the plugin's "
        "socket names, so the old and the new agent of a rolling update both serve.",
    )
    sim_chips: str = Field(
        default="",
        description="Simulated chips when the node has no sim.vnpu.io/chips annotation, "
        "e.g. 910B3=4,310P3=2.",
    )
    sim_device_dir: Path | None = Field(
        default=None,
        description="Sim driver only: make a character device vdavinci<id> here per vNPU "
        "(what a real driver makes under /dev), for a container runtime on a real node; "
        "one node only, as vNPU ids are per host. Unset: no device nodes.",
    )
    dra: bool = Field(
        default=False,
        description="Hand out this node's vNPUs through Dynamic Resource Allocation: publish "
        "its chips as a ResourceSlice pool (resource.k8s.io/v1, Kubernetes 1.34 or later; "
        "partitionable devices and binding conditions need 1.36) and serve the kubelet "
        "plugin; the operator then places no annotated pod here (docs/DRA.md).",
    )
    dra_verify_seconds: float = Field(
        default=300.0,
        gt=0,
        description="--dra: how often the node's ResourceSlices are read back and put back "
        "if someone else (the kubelet, an admin) changed or deleted them.",
    )
    npu_smi_path: str = Field(
        default="npu-smi", description="The npu-smi executable (npu-smi driver)."
    )
    dcmi_library: str = Field(
        default="libdcmi.so", description="The driver's DCMI library (dcmi driver)."
    )
    driver_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Longest one npu-smi call may take."
    )

    resync_seconds: float = Field(
        default=30.0, gt=0, description="Driver/allocation reconcile, GC and health interval."
    )
    gc_grace_seconds: float = Field(
        default=120.0,
        ge=0,
        description="How long an unreferenced, unused vNPU must stay so before it is destroyed.",
    )
    foreign_vnpu_policy: ForeignPolicy = Field(
        default="keep",
        description="vNPUs this agent did not create: keep (report only) or collect like orphans.",
    )
    inventory_min_interval_seconds: float = Field(
        default=5.0,
        ge=0,
        description="Coalesce VNPUNode status writes: at most one per interval.",
    )
    inventory_settle_seconds: float = Field(
        default=30.0,
        ge=0,
        description="A VNPUNode change that only restates the allocations (vNPUs they own "
        "created or in use, those of deleted allocations destroyed, the free figures and "
        "counts those move) is written this long after the first such change not yet "
        "written; any other change (a vNPU lost, a foreign one, health) at the minimum "
        "interval.",
    )
    lease_duration_seconds: int = Field(
        default=40,
        ge=5,
        description="How long the node counts as live after a Lease renewal "
        "(renewed three times per duration).",
    )
    watch_timeout_seconds: int = Field(
        default=300, ge=10, description="Server-side watch timeout; a silent stream is re-listed."
    )
    retry_max_seconds: float = Field(default=30.0, gt=0, description="Backoff ceiling.")

    metrics_port: MetricsPort = 9101

    @field_validator("cdi_host_device_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # A relative hostPath would be resolved against the runtime's working
        # directory, not the agent's.
        if not value.is_absolute():
            raise ValueError(f"must be an absolute path, not {str(value)!r}")
        return value

    @field_validator("simulate_nodes", mode="before")
    @classmethod
    def _split_nodes(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [n.strip() for n in value.split(",") if n.strip()]
        return value

    @model_validator(mode="before")
    @classmethod
    def _simulated_default_sim(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("simulate_nodes") and "driver" not in data:
            return {**data, "driver": "sim"}
        return data

    @model_validator(mode="after")
    def _check(self) -> AgentSettings:
        if self.simulate_nodes and self.driver != "sim":
            raise ValueError("--simulate-nodes needs --driver=sim")
        if self.sim_device_dir is not None and (self.driver != "sim" or len(self.nodes) != 1):
            raise ValueError("--sim-device-dir needs --driver=sim serving exactly one node")
        if not self.simulate_nodes and not self.node_name:
            raise ValueError("--node-name (VNPU_NODE_NAME) is required")
        if self.namespace is not None:
            if (
                "agent_namespace" in self.model_fields_set
                and self.namespace != self.agent_namespace
            ):
                raise ValueError(
                    f"--agent-namespace ({self.agent_namespace}) and its deprecated name "
                    f"--namespace / VNPU_NAMESPACE ({self.namespace}) disagree; give only "
                    "--agent-namespace (VNPU_AGENT_NAMESPACE)"
                )
            self.agent_namespace = self.namespace
        return self

    def deprecations(self) -> list[str]:
        """What the admin should change, for a warning at start."""
        if self.namespace is None:
            return []
        return [
            "--namespace / VNPU_NAMESPACE is deprecated and goes in the next release: "
            "use --agent-namespace / VNPU_AGENT_NAMESPACE"
        ]

    @property
    def nodes(self) -> list[str]:
        return self.simulate_nodes or [self.node_name]


def parse_args(argv: Sequence[str] | None = None) -> AgentSettings:
    """Settings from flags over environment; exits with a clear message on bad values."""
    return parse_settings(
        AgentSettings,
        argv,
        prog="vnpu-agent",
        description="The vnpu-operator node agent: creates and destroys the vNPUs "
        "the VNPUAllocations of its node declare, and reports the node's chips. "
        "`vnpu-agent check --help`: the hardware self-check (driver, chips, templates "
        "against the catalog; no cluster needed).",
    )
