"""Operator metrics. Counters and histograms accumulate; everything that
describes current state (allocations, chip capacity, waiting pods) is built
at scrape time from the controller's caches, so a deleted pod or allocation
leaves no series behind."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vnpu_common import names
from vnpu_operator.placement import ChipCapacity

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)


@dataclass(frozen=True)
class StateView:
    """What the scrape-time collector reads from the controller."""

    allocations: Callable[[], Iterable[Mapping[str, Any]]]
    capacity: Callable[[], Iterable[ChipCapacity]]
    waiting: Callable[[], int]
    live_nodes: Callable[[], Mapping[str, bool]]


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.allocation_latency = Histogram(
            "vnpu_operator_allocation_latency_seconds",
            "Pod seen by the operator -> vNPUs Ready and pod ungated.",
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.release_latency = Histogram(
            "vnpu_operator_release_latency_seconds",
            "No container of a deleted or terminal pod can run any more -> every vNPU "
            "destroyed and the pod finalizer removed.",
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.placement_failures = Counter(
            "vnpu_operator_placement_failures_total",
            "Placements that found no room, by primary reason.",
            ["reason"],
            registry=self.registry,
        )
        self.allocation_failures = Counter(
            "vnpu_operator_allocation_failures_total",
            "Allocations an agent reported Failed, by node.",
            ["node"],
            registry=self.registry,
        )
        # Written by kubeapi.OperatorApi: a handful of operations times the
        # statuses the API server answers, so the series stay few.
        self.api_errors = Counter(
            "vnpu_operator_api_errors_total",
            "Operator API writes that failed, by operation and HTTP status "
            "(none: no answer). AlreadyExists on create, and NotFound where a gone "
            "object leaves nothing to do (delete, finalizer, condition), are not failures.",
            ["operation", "status"],
            registry=self.registry,
        )

    def watch(self, view: StateView) -> None:
        self.registry.register(_StateCollector(view))


class _StateCollector(Collector):
    def __init__(self, view: StateView) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        allocs = GaugeMetricFamily(
            "vnpu_operator_allocations",
            "VNPUAllocation objects by phase, template and node.",
            labels=["phase", "template", "node"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        for obj in self._view.allocations():
            spec = obj.get("spec") or {}
            phase = (obj.get("status") or {}).get("phase") or names.PHASE_PENDING
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                phase = names.PHASE_RELEASING
            key = (phase, str(spec.get("template", "")), str(spec.get("nodeName", "")))
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            allocs.add_metric(list(key), n)

        capacity = GaugeMetricFamily(
            "vnpu_operator_chip_capacity",
            "Chip resources as placement books them (kind total, used or free).",
            labels=["node", "chip", "model", "resource", "kind"],
        )
        vnpus = GaugeMetricFamily(
            "vnpu_operator_chip_vnpus",
            "vNPUs booked on a chip, and its limit.",
            labels=["node", "chip", "model", "kind"],
        )
        unavailable = GaugeMetricFamily(
            "vnpu_operator_chip_unavailable",
            "1 for a chip that takes no new vNPU: cordoned by an admin or unhealthy by its "
            "driver (reason cordoned or unhealthy; a chip may have both series).",
            labels=["node", "chip", "model", "reason"],
        )
        for chip in self._view.capacity():
            labels = [chip.node, str(chip.chip), chip.model]
            if chip.cordoned is not None:
                unavailable.add_metric([*labels, "cordoned"], 1)
            if chip.health != "Healthy":
                unavailable.add_metric([*labels, "unhealthy"], 1)
            for resource in ("aicore", "memory_mb", "aicpu"):
                for kind, res in (("total", chip.total), ("used", chip.used), ("free", chip.free)):
                    capacity.add_metric([*labels, resource, kind], getattr(res, resource))
            vnpus.add_metric([*labels, "allocated"], chip.allocated)
            vnpus.add_metric([*labels, "limit"], chip.vnpu_limit)

        waiting = GaugeMetricFamily(
            "vnpu_operator_pods_waiting", "Gated pods waiting for vNPU capacity."
        )
        waiting.add_metric([], self._view.waiting())
        live = GaugeMetricFamily(
            "vnpu_operator_node_live",
            "1 if the node's agent Lease is valid and the Node exists.",
            labels=["node"],
        )
        for node, is_live in sorted(self._view.live_nodes().items()):
            live.add_metric([node], 1 if is_live else 0)
        yield from (allocs, capacity, vnpus, unavailable, waiting, live)
