"""Agent metrics. Counters accumulate; everything describing current state
(vNPUs, allocations, chip capacity) is built at scrape time from the node
agents, so an object that is gone leaves no series behind."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from vnpu_agent.node import NodeAgent


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.driver_ops = Counter(
            "vnpu_agent_driver_operations_total",
            "Driver calls by operation and result (ok or the error reason).",
            ["node", "op", "result"],
            registry=self.registry,
        )
        self.driver_seconds = Histogram(
            "vnpu_agent_driver_operation_seconds",
            "Driver call duration.",
            ["op"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 30),
        )
        self.gc_actions = Counter(
            "vnpu_agent_gc_actions_total",
            "Garbage collection actions by reason (orphan, foreign, kept-foreign, *-failed).",
            ["node", "reason"],
            registry=self.registry,
        )
        self.releases = Counter(
            "vnpu_agent_releases_total",
            "Allocations released (vNPU destroyed, finalizer removed).",
            ["node"],
            registry=self.registry,
        )
        self.node_restorations = Counter(
            "vnpu_agent_vnpunode_restorations_total",
            "The node's VNPUNode put back after someone else changed it, by what was "
            "changed (deleted, unlabelled, status).",
            ["node", "what"],
            registry=self.registry,
        )

    def driver_op(self, node: str, op: str, result: str, seconds: float) -> None:
        self.driver_ops.labels(node, op, result).inc()
        self.driver_seconds.labels(op).observe(seconds)

    def gc_action(self, node: str, reason: str) -> None:
        self.gc_actions.labels(node, reason).inc()

    def released(self, node: str) -> None:
        self.releases.labels(node).inc()

    def node_restored(self, node: str, what: str) -> None:
        self.node_restorations.labels(node, what).inc()

    def watch(self, agents: Callable[[], Iterable[NodeAgent]]) -> None:
        self.registry.register(_StateCollector(agents))


class _StateCollector(Collector):
    def __init__(self, agents: Callable[[], Iterable[NodeAgent]]) -> None:
        self._agents = agents

    def collect(self) -> Iterator[Metric]:
        vnpus = GaugeMetricFamily(
            "vnpu_agent_vnpus",
            "vNPUs present on the driver, by owner state.",
            labels=["node", "chip", "template", "state"],
        )
        allocs = GaugeMetricFamily(
            "vnpu_agent_allocation_info",
            "Allocations this agent serves (1 per allocation).",
            labels=["node", "namespace", "name", "vnpu_id", "template", "phase"],
        )
        capacity = GaugeMetricFamily(
            "vnpu_agent_chip_capacity",
            "Chip resources as the driver reports them.",
            labels=["node", "chip", "model", "resource", "kind"],
        )
        healthy = GaugeMetricFamily(
            "vnpu_agent_chip_healthy", "1 if the chip is healthy.", labels=["node", "chip", "model"]
        )
        for agent in self._agents():
            referenced = agent.referenced_ids()
            counts: dict[tuple[str, str, str, str], int] = {}
            for v in agent.vnpus.values():
                state = (
                    "allocated"
                    if v.id in referenced
                    else ("orphan" if v.id in agent.owned else "foreign")
                )
                k = (agent.node, str(v.chip), v.template, state)
                counts[k] = counts.get(k, 0) + 1
            for k, n in counts.items():
                vnpus.add_metric(list(k), n)
            for obj in agent.allocs.values():
                meta, spec = obj.get("metadata", {}), obj.get("spec", {})
                phase = obj.get("status", {}).get("phase") or "Pending"
                if meta.get("deletionTimestamp"):
                    phase = "Releasing"
                allocs.add_metric(
                    [
                        agent.node,
                        meta.get("namespace", ""),
                        meta.get("name", ""),
                        str(spec.get("vnpuId", "")),
                        str(spec.get("template", "")),
                        phase,
                    ],
                    1,
                )
            for c in agent.chips:
                labels = [agent.node, str(c.index), c.model]
                healthy.add_metric(labels, 1 if c.healthy else 0)
                for res, total, free in (
                    ("aicore", c.aicore_total, c.aicore_free),
                    ("memory_mb", c.memory_total_mb, c.memory_free_mb),
                    ("aicpu", c.aicpu_total, c.aicpu_free),
                ):
                    capacity.add_metric([*labels, res, "total"], total)
                    capacity.add_metric([*labels, res, "free"], free)
        yield from (vnpus, allocs, capacity, healthy)
