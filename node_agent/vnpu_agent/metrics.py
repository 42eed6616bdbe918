"""Agent metrics. Counters accumulate; everything describing current state
(vNPUs, allocations, chip capacity) is built at scrape time from the node
agents, so an object that is gone leaves no series behind.

Naming as the operator's (docs/DECISIONS.md, issue 16): one quantity in one
base unit per metric; chips are labelled `node`, `chip` (our index) and `id`
(the physical id, Ascend npu-exporter's `id`), a vNPU `v_dev_id` (npu-exporter's
label for it) and a pod `namespace` and `pod` (kube-state-metrics')."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from vnpu_agent.allocation import AllocationView
from vnpu_agent.drivers.base import VNPU, ChipInfo
from vnpu_common.kube.apiwrites import error_counter
from vnpu_common.process.metrics_registry import CHIP_LABELS, MIB, chip_gauge, component_registry
from vnpu_common.wire import names

PREFIX: Final = "vnpu_agent"


class NodeState(Protocol):
    """What the scrape-time collector reads of one node's agent (node.NodeAgent).
    A protocol, not the class: the agent's modules import this one."""

    @property
    def node(self) -> str: ...
    @property
    def chips(self) -> Sequence[ChipInfo]: ...
    @property
    def vnpus(self) -> Mapping[int, VNPU]: ...
    @property
    def owned(self) -> Container[int]: ...
    @property
    def allocs(self) -> Mapping[str, Mapping[str, Any]]: ...
    @property
    def dra_pool_published(self) -> bool | None:
        """Whether the API server holds the node's DRA pool as last told
        (dra/publisher.PoolPublisher.published); None: not a DRA node."""
        ...

    def referenced_ids(self) -> set[int]: ...


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or component_registry(PREFIX)
        self.driver_ops = Counter(
            f"{PREFIX}_driver_operations_total",
            "Driver calls by operation and result (ok or the error reason).",
            ["node", "op", "result"],
            registry=self.registry,
        )
        self.driver_seconds = Histogram(
            f"{PREFIX}_driver_operation_duration_seconds",
            "Driver call duration.",
            ["op"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 30),
        )
        self.gc_actions = Counter(
            f"{PREFIX}_gc_actions_total",
            "Garbage collection actions by reason (orphan, foreign, kept-foreign, *-failed).",
            ["node", "reason"],
            registry=self.registry,
        )
        self.releases = Counter(
            f"{PREFIX}_releases_total",
            "Allocations released (vNPU destroyed, finalizer removed).",
            ["node"],
            registry=self.registry,
        )
        self.node_restorations = Counter(
            f"{PREFIX}_vnpunode_restorations_total",
            "The node's VNPUNode put back after someone else changed it, by what was "
            "changed (deleted, unlabelled, status).",
            ["node", "what"],
            registry=self.registry,
        )

        # The kubelet plugin's calls (dra/prepare.py): the kubelet gives each 45 s.
        self.dra_call_seconds = Histogram(
            f"{PREFIX}_dra_prepare_seconds",
            "Duration of the kubelet's NodePrepareResources and NodeUnprepareResources "
            "calls, by op (prepare, unprepare).",
            ["op"],
            registry=self.registry,
            buckets=(0.01, 0.05, 0.25, 1, 5, 15, 30, 45),
        )
        self.dra_call_errors = Counter(
            f"{PREFIX}_dra_prepare_errors_total",
            "Claims the kubelet plugin answered with an error, by op (prepare, unprepare).",
            ["op"],
            registry=self.registry,
        )
        # Not by node: one series per operation whatever the node count (a
        # process simulating 1000 nodes), and per node the agent's log names them.
        self.dra_pool_writes = Counter(
            f"{PREFIX}_dra_pool_writes_total",
            "ResourceSlices of the nodes' DRA pools written, by operation (create, "
            "update, delete). Steady at zero on a quiet node: a pool is written when "
            "its chips, cordons or the capacity held outside claims change, or when "
            "someone else changed or deleted it.",
            ["op"],
            registry=self.registry,
        )

        # Written by kubeapi.AgentApi, through vnpu_common.kube.apiwrites.
        self.api_errors = error_counter(
            PREFIX,
            "Agent API writes that failed, by operation and HTTP status (none: no "
            "answer). An answer the agent acts on is not a failure: NotFound before a "
            "create (VNPUNode, Lease), AlreadyExists before a label, NotFound or a failed "
            "test where the allocation is gone or was replaced.",
            self.registry,
        )

    def driver_op(self, node: str, op: str, result: str, seconds: float) -> None:
        self.driver_ops.labels(node, op, result).inc()
        self.driver_seconds.labels(op).observe(seconds)

    def dra_serving(self) -> None:
        """The kubelet plugin serves: its error series exist from now, at 0,
        so that the first failed call is an increase a rate() sees (a series
        born at 1 shows none)."""
        for op in ("prepare", "unprepare"):
            self.dra_call_errors.labels(op)

    def dra_call(self, op: str, seconds: float, failed: int) -> None:
        self.dra_call_seconds.labels(op).observe(seconds)
        if failed:
            self.dra_call_errors.labels(op).inc(failed)

    def gc_action(self, node: str, reason: str) -> None:
        self.gc_actions.labels(node, reason).inc()

    def released(self, node: str) -> None:
        self.releases.labels(node).inc()

    def dra_pool_write(self, op: str) -> None:
        self.dra_pool_writes.labels(op).inc()

    def node_restored(self, node: str, what: str) -> None:
        self.node_restorations.labels(node, what).inc()

    def watch(self, agents: Callable[[], Iterable[NodeState]], *, pod_names: bool = True) -> None:
        """Series of the nodes' state; without `pod_names`, vnpu_agent_allocation
        names no tenant's pod or allocation (metrics_pod_names)."""
        self.registry.register(_StateCollector(agents, pod_names=pod_names))


class _StateCollector(Collector):
    def __init__(
        self, agents: Callable[[], Iterable[NodeState]], *, pod_names: bool = True
    ) -> None:
        self._agents = agents
        self._pod_names = pod_names

    def collect(self) -> Iterator[Metric]:
        vnpus = GaugeMetricFamily(
            f"{PREFIX}_vnpus",
            "vNPUs present on the driver, by owner state (allocated: an allocation "
            "declares it; orphan: this agent made it and nothing declares it; foreign: "
            "not made by this agent).",
            labels=[*CHIP_LABELS, "template", "state"],
        )
        allocs = InfoMetricFamily(
            f"{PREFIX}_allocation",
            "Allocations this agent serves: which pod owns which vNPU (value 1).",
            labels=[
                "node", "namespace", "allocation", "pod", "chip", "id", "v_dev_id",
                "template", "phase",
            ],
        )  # fmt: skip

        driver = "as the driver reports them"
        aicore_cap = chip_gauge(PREFIX, "aicore_capacity", "AI Cores of the chip.")
        aicore_free = chip_gauge(PREFIX, "aicore_free", f"AI Cores free, {driver}.")
        memory_cap = chip_gauge(PREFIX, "memory_capacity_bytes", "Device memory of the chip.")
        memory_free = chip_gauge(PREFIX, "memory_free_bytes", f"Device memory free, {driver}.")
        aicpu_cap = chip_gauge(PREFIX, "aicpu_capacity", "AI CPUs of the chip.")
        aicpu_free = chip_gauge(PREFIX, "aicpu_free", f"AI CPUs free, {driver}.")
        healthy = chip_gauge(PREFIX, "healthy", "1 if the driver reports the chip healthy.")
        published = GaugeMetricFamily(
            f"{PREFIX}_dra_pool_published",
            "DRA nodes only: 1 while the API server holds the node's ResourceSlice pool as "
            "the agent last wrote or confirmed it, 0 before it is first published, after a "
            "failed write and while a pool someone else changed or deleted waits for its "
            "repair.",
            labels=["node"],
        )
        for agent in self._agents():
            if (pool := agent.dra_pool_published) is not None:
                published.add_metric([agent.node], 1 if pool else 0)
            physical = {c.index: str(c.physical_id) for c in agent.chips}
            models = {c.index: c.model for c in agent.chips}
            referenced = agent.referenced_ids()
            counts: dict[tuple[str, ...], int] = {}
            for v in agent.vnpus.values():
                state = (
                    "allocated"
                    if v.id in referenced
                    else ("orphan" if v.id in agent.owned else "foreign")
                )
                chip = (agent.node, str(v.chip), physical.get(v.chip, ""), models.get(v.chip, ""))
                k = (*chip, v.template, state)
                counts[k] = counts.get(k, 0) + 1
            for key, n in counts.items():
                vnpus.add_metric(list(key), n)
            for a in map(AllocationView.of, agent.allocs.values()):
                phase = names.PHASE_RELEASING if a.deleting else a.phase or names.PHASE_PENDING
                allocs.add_metric(
                    [],
                    {
                        "node": agent.node,
                        "namespace": a.namespace or "",
                        # v_dev_id still tells a node's allocations apart.
                        "allocation": (a.name or "") if self._pod_names else "",
                        "pod": a.pod if self._pod_names else "",
                        "chip": "" if a.chip is None else str(a.chip),
                        "id": "" if a.chip is None else physical.get(a.chip, ""),
                        "v_dev_id": "" if a.id is None else str(a.id),
                        "template": a.template,
                        "phase": phase,
                    },
                )
            for c in agent.chips:
                labels = [agent.node, str(c.index), str(c.physical_id), c.model]
                healthy.add_metric(labels, 1 if c.healthy else 0)
                aicore_cap.add_metric(labels, c.aicore_total)
                aicore_free.add_metric(labels, c.aicore_free)
                memory_cap.add_metric(labels, c.memory_total_mb * MIB)
                memory_free.add_metric(labels, c.memory_free_mb * MIB)
                aicpu_cap.add_metric(labels, c.aicpu_total)
                aicpu_free.add_metric(labels, c.aicpu_free)
        yield from (vnpus, allocs, healthy, published)
        yield from (aicore_cap, aicore_free, memory_cap, memory_free, aicpu_cap, aicpu_free)
