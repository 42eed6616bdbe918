"""Operator metrics. Counters and histograms accumulate; everything that
describes current state (allocations, chip capacity, waiting pods) is built
at scrape time from the controller's caches, so a deleted pod or allocation
leaves no series behind.

Naming (docs/DECISIONS.md, issue 16): one quantity in one base unit per
metric, capacity apart from use; pods are labelled `namespace` and `pod` as
kube-state-metrics labels them, chips `node`, `chip` (our index, as in a
VNPUAllocation) and `id` (the physical id Ascend's npu-exporter labels them
with)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vnpu_common.kube.apiwrites import error_counter
from vnpu_common.process.metrics_registry import MIB, chip_gauge, component_registry
from vnpu_common.wire import names
from vnpu_operator.placement import ChipCapacity
from vnpu_operator.placement.fragmentation import Fragmentation, total

PREFIX: Final = "vnpu_operator"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
# An admission answer is computed in memory: milliseconds, and the API
# server's timeout (10 s by default) is the far end.
ADMISSION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


@dataclass(frozen=True)
class WaitingPod:
    """A pod gated for want of capacity: who, why (the placement reason code)
    and how long it has waited."""

    namespace: str
    pod: str
    reason: str
    waited_seconds: float


@dataclass(frozen=True)
class StateView:
    """What the scrape-time collector reads from the controller."""

    allocations: Callable[[], Iterable[Mapping[str, Any]]]
    capacity: Callable[[], Iterable[ChipCapacity]]
    waiting: Callable[[], Iterable[WaitingPod]]
    live_nodes: Callable[[], Mapping[str, bool]]
    # Node -> its fragmentation figure (Ledger.fragmentation).
    fragmentation: Callable[[], Mapping[str, Fragmentation]] = dict


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or component_registry(PREFIX)
        self.allocation_latency = Histogram(
            f"{PREFIX}_allocation_latency_seconds",
            "Pod seen by the operator -> vNPUs Ready and pod ungated.",
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.release_latency = Histogram(
            f"{PREFIX}_release_latency_seconds",
            "No container of a deleted or terminal pod can run any more -> every vNPU "
            "destroyed and the pod finalizer removed.",
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.placement_failures = Counter(
            f"{PREFIX}_placement_failures_total",
            "Placements that found no room, by primary reason.",
            ["reason"],
            registry=self.registry,
        )
        self.allocation_failures = Counter(
            f"{PREFIX}_allocation_failures_total",
            "Allocations an agent reported Failed, by node.",
            ["node"],
            registry=self.registry,
        )
        # Written by steps.preempt.Preemption (only with --preemption).
        self.preemption_attempts = Counter(
            f"{PREFIX}_preemption_attempts_total",
            "Preemptions tried for a waiting vNPU pod, by result (evicted: victims "
            "evicted and the node claimed; blocked: a PodDisruptionBudget refused a "
            "victim and no other plan was found; failed: an eviction call failed).",
            ["result"],
            registry=self.registry,
        )
        self.preemption_victims = Counter(
            f"{PREFIX}_preemption_victims_total",
            "vNPU pods evicted to make room for a pod of higher priority.",
            registry=self.registry,
        )
        # Written by dra.claims.ClaimController and dra.pools.DeadPools (docs/DRA.md).
        self.dra_claims_refused = Counter(
            f"{PREFIX}_dra_claims_refused_total",
            "ResourceClaim devices the operator failed back to the scheduler (binding-failure "
            "condition written), by reason: AgentDown, NotDRANode, UnknownDevice, Cordoned, "
            "Unhealthy, NoCapacity, NoFreeId, ClaimDeleting, AdminAccess, ExtendedResource.",
            ["reason"],
            registry=self.registry,
        )
        self.dra_slices_deleted = Counter(
            f"{PREFIX}_dra_slices_deleted_total",
            "ResourceSlices of driver vnpu.io the operator deleted because their node's agent "
            "Lease expired (the agent publishes them again when it is back).",
            registry=self.registry,
        )
        # Written by kubeapi.OperatorApi, through vnpu_common.kube.apiwrites.
        self.api_errors = error_counter(
            PREFIX,
            "Operator API writes that failed, by operation and HTTP status "
            "(none: no answer). AlreadyExists on create, and NotFound where a gone "
            "object leaves nothing to do (delete, finalizer, condition), are not failures.",
            self.registry,
        )
        # Written by leader.Leadership (docs/HELM.md, 'High availability').
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 on the replica that leads (places, releases, writes), 0 on a standby.",
            registry=self.registry,
        )
        self.leader_changes = Counter(
            f"{PREFIX}_leader_changes_total",
            "Times this replica started or stopped leading.",
            registry=self.registry,
        )
        self.fenced_writes = Counter(
            f"{PREFIX}_fenced_writes_total",
            "Writes this replica refused to send because it did not lead (or its last "
            "renewal of the leader Lease was older than the renew deadline), by operation.",
            ["operation"],
            registry=self.registry,
        )
        # Written by admission.webhook: webhook is mutate or validate.
        self.admission_requests = Counter(
            f"{PREFIX}_admission_requests_total",
            "AdmissionReviews answered, by webhook and outcome (allowed, denied, "
            "bad-request: not a review we can read, error: the webhook failed).",
            ["webhook", "outcome"],
            registry=self.registry,
        )
        self.admission_denials = Counter(
            f"{PREFIX}_admission_denials_total",
            "Pods the webhooks refused, by webhook and reason (not-synced, invalid-request, "
            "no-charge, over-quota, not-mutated).",
            ["webhook", "reason"],
            registry=self.registry,
        )
        self.admission_duration = Histogram(
            f"{PREFIX}_admission_duration_seconds",
            "Time to answer one AdmissionReview, body read to answer encoded.",
            ["webhook"],
            registry=self.registry,
            buckets=ADMISSION_BUCKETS,
        )

    def watch(self, view: StateView, *, pod_names: bool = True) -> None:
        """Series of the controller's state; without `pod_names`, no series
        names a tenant's pod (metrics_pod_names)."""
        self.registry.register(_StateCollector(view, pod_names=pod_names))

    def watch_certificate(self, not_after: Callable[[], float | None]) -> None:
        """`not_after`: epoch seconds at which the webhook's serving
        certificate expires, None while unknown (no series then)."""
        self.registry.register(_CertificateCollector(not_after))


class _CertificateCollector(Collector):
    def __init__(self, not_after: Callable[[], float | None]) -> None:
        self._not_after = not_after

    def collect(self) -> Iterator[Metric]:
        expiry = GaugeMetricFamily(
            f"{PREFIX}_webhook_certificate_expiration_timestamp_seconds",
            "When the admission webhook's serving certificate expires (Unix time).",
        )
        try:
            value = self._not_after()
        except Exception:
            # A scrape never fails for a certificate that cannot be read:
            # the series goes missing instead, which an alert can see.
            value = None
        if value is not None:
            expiry.add_metric([], value)
        yield expiry


class _StateCollector(Collector):
    def __init__(
        self,
        view: StateView,
        clock: Callable[[], float] = time.time,
        *,
        pod_names: bool = True,
    ) -> None:
        self._view = view
        self._clock = clock
        self._pod_names = pod_names

    def collect(self) -> Iterator[Metric]:
        yield self._allocations()
        yield from self._chips()
        yield from self._waiting()
        yield from self._fragmentation()
        live = GaugeMetricFamily(
            f"{PREFIX}_node_live",
            "1 if the node's agent Lease is valid and the Node exists.",
            labels=["node"],
        )
        for node, is_live in sorted(self._view.live_nodes().items()):
            live.add_metric([node], 1 if is_live else 0)
        yield live

    def _allocations(self) -> Metric:
        allocs = GaugeMetricFamily(
            f"{PREFIX}_allocations",
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
        return allocs

    def _chips(self) -> Iterator[Metric]:
        booked = "as placement books them: declared vNPUs and undeclared ones"
        aicore_cap = chip_gauge(PREFIX, "aicore_capacity", "AI Cores of the chip.")
        aicore_used = chip_gauge(PREFIX, "aicore_used", f"AI Cores in use, {booked}.")
        memory_cap = chip_gauge(PREFIX, "memory_capacity_bytes", "Device memory of the chip.")
        memory_used = chip_gauge(PREFIX, "memory_used_bytes", f"Device memory in use, {booked}.")
        aicpu_cap = chip_gauge(PREFIX, "aicpu_capacity", "AI CPUs of the chip.")
        aicpu_used = chip_gauge(PREFIX, "aicpu_used", f"AI CPUs in use, {booked}.")
        vnpu_cap = chip_gauge(PREFIX, "vnpu_capacity", "The most vNPUs the chip can hold.")
        vnpus = chip_gauge(
            PREFIX,
            "vnpus",
            "vNPUs on the chip by state (allocated: an allocation declares it; undeclared: "
            "none does, the agent's orphans and foreign vNPUs alike).",
            ("state",),
        )
        unavailable = chip_gauge(
            PREFIX,
            "unavailable",
            "1 for a chip that takes no new vNPU: cordoned by an admin or unhealthy by its "
            "driver (reason cordoned or unhealthy; a chip may have both series).",
            ("reason",),
        )
        for chip in self._view.capacity():
            labels = [chip.node, str(chip.chip), str(chip.physical_id), chip.model]
            if chip.cordoned is not None:
                unavailable.add_metric([*labels, "cordoned"], 1)
            if chip.health != "Healthy":
                unavailable.add_metric([*labels, "unhealthy"], 1)
            aicore_cap.add_metric(labels, chip.total.aicore)
            aicore_used.add_metric(labels, chip.used.aicore)
            memory_cap.add_metric(labels, chip.total.memory_mb * MIB)
            memory_used.add_metric(labels, chip.used.memory_mb * MIB)
            aicpu_cap.add_metric(labels, chip.total.aicpu)
            aicpu_used.add_metric(labels, chip.used.aicpu)
            vnpu_cap.add_metric(labels, chip.vnpu_limit)
            vnpus.add_metric([*labels, "allocated"], chip.allocated)
            vnpus.add_metric([*labels, "undeclared"], chip.orphans)
        yield from (aicore_cap, aicore_used, memory_cap, memory_used, aicpu_cap, aicpu_used)
        yield from (vnpu_cap, vnpus, unavailable)

    def _fragmentation(self) -> Iterator[Metric]:
        largest = "the largest template each chip model offers"
        ratio = GaugeMetricFamily(
            f"{PREFIX}_node_fragmentation_ratio",
            f"How much of what the node's free capacity would take of {largest}, were it "
            "gathered on whole chips, scattering loses: 0 none, 1 all.",
            labels=["node"],
        )
        fits = GaugeMetricFamily(
            f"{PREFIX}_largest_template_fits",
            f"More vNPUs of {largest} that fit on the node now, summed over its chip models.",
            labels=["node"],
        )
        gathered = GaugeMetricFamily(
            f"{PREFIX}_largest_template_fits_gathered",
            f"More vNPUs of {largest} that would fit were the node's free capacity gathered "
            "on whole chips.",
            labels=["node"],
        )
        free = GaugeMetricFamily(
            f"{PREFIX}_node_free_aicore",
            "AI Cores free on the node's healthy, uncordoned chips.",
            labels=["node"],
        )
        usable = GaugeMetricFamily(
            f"{PREFIX}_node_largest_template_aicore",
            f"Of the free AI Cores, those the vNPUs of {largest} that fit now would take.",
            labels=["node"],
        )
        cluster = GaugeMetricFamily(
            f"{PREFIX}_cluster_fragmentation_ratio",
            "node_fragmentation_ratio over every node's free capacity together "
            "(a pod never spans nodes, so each node is gathered on its own).",
        )
        figures = self._view.fragmentation()
        for node, figure in sorted(figures.items()):
            ratio.add_metric([node], round(figure.ratio, 4))
            fits.add_metric([node], figure.largest_fits)
            gathered.add_metric([node], figure.ideal_fits)
            free.add_metric([node], figure.free_aicore)
            usable.add_metric([node], figure.usable_aicore)
        cluster.add_metric([], round(total(figures.values()).ratio, 4))
        yield from (ratio, fits, gathered, free, usable, cluster)

    def _waiting(self) -> Iterator[Metric]:
        count = GaugeMetricFamily(
            f"{PREFIX}_pods_waiting",
            "Gated pods waiting for vNPU capacity, by the placement's primary reason.",
            labels=["reason"],
        )
        since = GaugeMetricFamily(
            f"{PREFIX}_pod_waiting_since_timestamp_seconds",
            "When a gated pod started to wait for vNPU capacity (Unix time), with the "
            "placement's primary reason.",
            labels=["namespace", "pod", "reason"],
        )
        now = self._clock()
        counts: dict[str, int] = {}
        # Without pod names, a namespace's longest wait per reason (pod ""): the
        # waiting alert still fires, naming the namespace only.
        started: dict[tuple[str, str, str], float] = {}
        for pod in self._view.waiting():
            counts[pod.reason] = counts.get(pod.reason, 0) + 1
            key = (pod.namespace, pod.pod if self._pod_names else "", pod.reason)
            # To the millisecond, so that scrapes of one wait agree.
            at = round(now - pod.waited_seconds, 3)
            started[key] = min(at, started.get(key, at))
        for key, at in started.items():
            since.add_metric(list(key), at)
        for reason, n in sorted(counts.items()):
            count.add_metric([reason], n)
        yield from (count, since)
