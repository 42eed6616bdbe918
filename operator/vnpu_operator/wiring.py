"""The composition root: every part of the operator, built in the order they
need each other, then connected where each must tell another of a change.
`build` returns them all as one record (`Parts`), which `main` runs;
`build_pods` is its cluster-free half (the pod controller and the parts it
drives), which the unit tests build too. The controller is given only what it
uses; whoever else needs a part gets it from here, not through the controller."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common import __version__
from vnpu_common.kube.apiclient import api_client as new_api_client
from vnpu_common.kube.informer import Informer
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.admission.server import WebhookServer
from vnpu_operator.advertise import Advertiser
from vnpu_operator.config import OperatorSettings
from vnpu_operator.controller import Controller
from vnpu_operator.convergence import Convergence, for_controller
from vnpu_operator.dra.claimapi import ClaimApi
from vnpu_operator.dra.claims import ClaimController
from vnpu_operator.dra.pools import DeadPools, PoolApi
from vnpu_operator.handlers import register
from vnpu_operator.inventories import Inventories
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.leader import Leadership
from vnpu_operator.leases import LeaseWatch
from vnpu_operator.leaving import Leaving
from vnpu_operator.metrics import OperatorMetrics, StateView
from vnpu_operator.notices import Notices
from vnpu_operator.placement import Ledger
from vnpu_operator.podstate import Expectations, PodState
from vnpu_operator.steps.pin import Pinner
from vnpu_operator.steps.place import Placer
from vnpu_operator.steps.preempt import Preemption
from vnpu_operator.waiting import WaitingLine
from vnpu_operator.watches import (
    allocation_informer,
    claim_informer,
    node_informer,
    pod_informer,
    quota_informer,
    vnpunode_informer,
)

log = logging.getLogger("vnpu_operator")


@dataclass(frozen=True)
class Pods:
    """The pod controller and the parts others share with it: the ledger it
    books in, the writes it expects back, the nodes' inventories and the
    Node resources' advertiser."""

    controller: Controller
    ledger: Ledger
    expect: Expectations
    inventories: Inventories
    advertiser: Advertiser


@dataclass(frozen=True)
class Parts:
    """Every part of the operator, built and connected; `main` runs them.
    `claims` is None where DRA is off or the API server does not serve it."""

    settings: OperatorSettings
    metrics: OperatorMetrics
    api_client: ApiClient
    api: OperatorApi
    leadership: Leadership
    pods: Pods
    quotas: QuotaBook
    webhook: WebhookServer
    leases: LeaseWatch
    convergence: Convergence
    claims: ClaimController | None
    informers: tuple[Informer, ...]
    registry: kopf.OperatorRegistry

    @property
    def controller(self) -> Controller:
        return self.pods.controller

    def ready(self) -> bool:
        """The readiness probe: caches synced, and the webhook not draining."""
        return self.controller.is_synced() and not self.webhook.draining

    def not_ready(self) -> str:
        return "stopping" if self.webhook.draining else "caches not synced"


def build_claims(
    api: OperatorApi,
    api_client: ApiClient,
    pods: Pods,
    settings: OperatorSettings,
    metrics: OperatorMetrics,
    leadership: Leadership | None = None,
) -> ClaimController:
    """The DRA front-end: books in the pod controller's ledger and acts only
    once its caches are synced, and only while this replica leads (its
    writes are fenced as the pod controller's are). A DRA node that stops
    being live loses its pool and its claims' vNPUs not ready yet."""
    fence = leadership.check if leadership else None
    controller = pods.controller
    pools = DeadPools(
        PoolApi(api_client, metrics.api_errors, fence),
        pods.ledger,
        agent_namespace=settings.agent_namespace,
        grace_seconds=settings.lease_grace_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        ready=controller.is_synced,
        deleted=metrics.dra_slices_deleted,
    )
    claims = ClaimController(
        api,
        ClaimApi(api_client, metrics.api_errors, fence),
        pods.ledger,
        ready=controller.is_synced,
        retry_max_seconds=settings.retry_max_seconds,
        expect=pods.expect,
        metrics=metrics,
        pools=pools,
    )
    if leadership is not None:
        claims.leading = leadership.leading
        leadership.on_change(claims.lead, lambda: None)
    lost = pods.inventories.lost

    def node_lost(node: str, why: str) -> None:
        lost(node, why)
        claims.node_lost(node)

    pods.inventories.lost = node_lost
    return claims


def follow_leadership(pods: Pods, api: OperatorApi, leadership: Leadership) -> None:
    """Only the leader reconciles and writes: the controller's queues (pods,
    Node resources) run while `leadership` leads, and on taking over it
    reconciles everything its warm caches hold. Each change is an Event on
    the Lease (from the new leader) and a log line (from both)."""
    controller = pods.controller
    controller.leading = leadership.leading
    pods.advertiser.ready = controller.is_active
    leadership.on_change(controller.lead, controller.follow)
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": leadership.name, "namespace": leadership.namespace},
    }

    async def announce(reason: str, message: str) -> None:
        await api.event(lease, reason=reason, message=message)

    leadership.announce = announce


def build_pods(
    api: OperatorApi,
    settings: OperatorSettings,
    metrics: OperatorMetrics,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> Pods:
    """`clock`: monotonic seconds (latencies, waits); `wall`: the time
    agents' Leases are compared with."""
    ledger = Ledger()
    notices = Notices(api)
    expect = Expectations()
    # The controller's caches (slim copies of what the watches deliver, by
    # UID or name) and its record of each pod, which the steps and the
    # waiting line read too.
    pods: dict[str, Raw] = {}
    allocs: dict[str, Raw] = {}
    states: dict[str, PodState] = {}

    inventories = Inventories(ledger, settings, wall=wall)
    advertiser = Advertiser(
        api, ledger, inventories.nodes, retry_max_seconds=settings.retry_max_seconds
    )
    waiting_line = WaitingLine(states, pods, clock=clock)
    preemption = Preemption(
        api, notices, ledger, settings, metrics, pods=pods, allocs=allocs, clock=clock
    )
    placer = Placer(
        api, notices, ledger, expect, settings, metrics, preemption,
        stopped_waiting=waiting_line.stop, started_waiting=waiting_line.enter,
    )  # fmt: skip
    leaving = Leaving(pods, ledger, inventories.nodes)
    pinner = Pinner(
        api, notices, ledger, expect, metrics, leaving, labels=inventories.labels, clock=clock
    )
    controller = Controller(
        api, settings, metrics,
        ledger=ledger, notices=notices, expect=expect, inventories=inventories,
        advertiser=advertiser, waiting_line=waiting_line,
        preemption=preemption, placer=placer, pinner=pinner, leaving=leaving,
        pods=pods, allocs=allocs, states=states, clock=clock,
    )  # fmt: skip

    # Who tells whom: a node's inventory changed (capacity may have grown,
    # its totals are advertised again) or it stopped being live; the caches
    # are synced (a node without a VNPUNode really has none); a pod needs a
    # reconcile; a claim was dropped (capacity may have grown).
    inventories.grown = controller.kick_waiting
    inventories.lost = controller.node_lost
    inventories.refreshed = advertiser.changed
    advertiser.ready = controller.is_synced
    waiting_line.kick = controller.kick
    waiting_line.still_waits = placer.still_waits
    preemption.kick = controller.kick
    pinner.kick = controller.kick
    preemption.grew = controller.kick_waiting

    metrics.watch(
        StateView(
            allocations=lambda: list(allocs.values()),
            capacity=ledger.capacity,
            waiting=waiting_line.waiting_pods,
            live_nodes=inventories.live,
            fragmentation=ledger.fragmentation,
        ),
        pod_names=settings.metrics_pod_names,
    )
    return Pods(controller, ledger, expect, inventories, advertiser)


async def serves_resource_api(api_client: ApiClient) -> bool:
    """Whether the API server serves resource.k8s.io/v1 (Kubernetes 1.34+),
    which the DRA front-end watches. Any answer but NotFound counts as yes:
    the claim informer retries a server that is briefly away."""
    try:
        await call_json(client.ResourceV1Api(api_client).get_api_resources)
    except ApiException as exc:
        if exc.status != 404:
            return True
        log.info(
            "the API server does not serve %s: ResourceClaims are not served (docs/DRA.md)",
            names.RESOURCE_API,
        )
        return False
    return True


async def build(settings: OperatorSettings) -> Parts:
    """Every part of the operator, for a loaded kube configuration. Asks the
    API server once, whether it serves ResourceClaims."""
    # The replica's Lease identity in its User-Agent: an audit log says which replica wrote.
    identity = settings.election_identity()
    # Its fenced writes ask the leader election again just before they go out.
    api_client = new_api_client(
        f"{names.USER_AGENT_OPERATOR}/{__version__} ({identity})", fenced=True
    )
    metrics = OperatorMetrics()
    timing = settings.election_timing()
    leadership = Leadership(
        client.CoordinationV1Api(api_client) if settings.leader_election else None,
        settings.leader_election_namespace or settings.agent_namespace,
        identity,
        timing=timing,
        leader_gauge=metrics.leader,
        changes=metrics.leader_changes,
        refused=metrics.fenced_writes,
        # Its own client in its own thread: a busy controller loop delays no renewal.
        # The same configuration as the main client's: Kopf's login loads the
        # default one again later, from wherever it looks.
        thread_api=lambda: new_api_client(
            f"{names.USER_AGENT_OPERATOR}/{__version__} ({identity}) leader-election",
            connections=timing.connections,
            fenced=True,
            configuration=api_client.configuration,
        ),
    )
    api = OperatorApi(api_client, metrics.api_errors, leadership.check)
    pods = build_pods(api, settings, metrics)
    controller, inventories = pods.controller, pods.inventories
    follow_leadership(pods, api, leadership)
    quotas = QuotaBook()
    webhook = WebhookServer(settings, controller.offered_templates, quotas, metrics)
    leases = LeaseWatch(
        client.CoordinationV1Api(api_client),
        settings.agent_namespace,
        inventories.leases,
        retry_max=settings.retry_max_seconds,
        timeout_seconds=settings.watch_timeout_seconds,
    )
    convergence = for_controller(
        controller,
        inventories,
        api.pod_gone,
        api_client,
        interval=settings.converge_seconds,
        retry_max=settings.retry_max_seconds,
    )
    claims = None
    if settings.dra and await serves_resource_api(api_client):
        claims = build_claims(api, api_client, pods, settings, metrics, leadership)
    informers = [
        vnpunode_informer(api_client, controller, inventories, settings),
        node_informer(api_client, controller, inventories, settings),
        pod_informer(api_client, controller, settings),
        allocation_informer(api_client, controller, settings, claims),
        quota_informer(api_client, quotas, settings),
    ]
    if claims is not None:
        informers.append(claim_informer(api_client, claims, settings))

    async def stop_serving() -> None:
        await webhook.drain(settings.webhook_drain_seconds)
        await webhook.stop()

    registry = kopf.OperatorRegistry()
    register(
        registry, controller, settings, leases, convergence, informers, leadership, stop_serving
    )
    return Parts(
        settings=settings,
        metrics=metrics,
        api_client=api_client,
        api=api,
        leadership=leadership,
        pods=pods,
        quotas=quotas,
        webhook=webhook,
        leases=leases,
        convergence=convergence,
        claims=claims,
        informers=tuple(informers),
        registry=registry,
    )
