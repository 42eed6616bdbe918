"""Composition: the controller and the parts it drives, built in the order
they need each other, then connected where each must tell another of a
change. `main` runs the controller built here, and so do the tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from kubernetes_asyncio.client import ApiClient

from vnpu_common.types import Raw
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.advertise import Advertiser
from vnpu_operator.config import OperatorSettings
from vnpu_operator.controller import Controller
from vnpu_operator.dra.claimapi import ClaimApi
from vnpu_operator.dra.claims import ClaimController
from vnpu_operator.dra.pools import DeadPools, PoolApi
from vnpu_operator.inventories import Inventories
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.leader import Leadership
from vnpu_operator.leaving import Leaving
from vnpu_operator.metrics import OperatorMetrics, StateView
from vnpu_operator.notices import Notices
from vnpu_operator.placement import Ledger
from vnpu_operator.podstate import Expectations, PodState
from vnpu_operator.steps.pin import Pinner
from vnpu_operator.steps.place import Placer
from vnpu_operator.steps.preempt import Preemption
from vnpu_operator.waiting import WaitingLine


def build_claims(
    api: OperatorApi,
    api_client: ApiClient,
    controller: Controller,
    metrics: OperatorMetrics,
    leadership: Leadership | None = None,
) -> ClaimController:
    """The DRA front-end: books in the pod controller's ledger and acts only
    once its caches are synced, and only while this replica leads (its
    writes are fenced as the pod controller's are). A DRA node that stops
    being live loses its pool and its claims' vNPUs not ready yet."""
    fence = leadership.check if leadership else None
    settings = controller.settings
    pools = DeadPools(
        PoolApi(api_client, metrics.api_errors, fence),
        controller.ledger,
        agent_namespace=settings.agent_namespace,
        grace_seconds=settings.lease_grace_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        ready=controller.is_synced,
        deleted=metrics.dra_slices_deleted,
    )
    claims = ClaimController(
        api,
        ClaimApi(api_client, metrics.api_errors, fence),
        controller.ledger,
        ready=controller.is_synced,
        retry_max_seconds=settings.retry_max_seconds,
        expect=controller.expect,
        metrics=metrics,
        pools=pools,
    )
    if leadership is not None:
        claims.leading = leadership.leading
        leadership.on_change(claims.lead, lambda: None)
    lost = controller.inventories.lost

    def node_lost(node: str, why: str) -> None:
        lost(node, why)
        claims.node_lost(node)

    controller.inventories.lost = node_lost
    return claims


def follow_leadership(controller: Controller, leadership: Leadership) -> None:
    """Only the leader reconciles and writes: the controller's queues (pods,
    Node resources) run while `leadership` leads, and on taking over it
    reconciles everything its warm caches hold. Each change is an Event on
    the Lease (from the new leader) and a log line (from both)."""
    controller.leading = leadership.leading
    controller.advertiser.ready = controller.is_active
    leadership.on_change(controller.lead, controller.follow)
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": leadership.name, "namespace": leadership.namespace},
    }

    async def announce(reason: str, message: str) -> None:
        await controller.api.event(lease, reason=reason, message=message)

    leadership.announce = announce


def build_controller(
    api: OperatorApi,
    settings: OperatorSettings,
    metrics: OperatorMetrics,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> Controller:
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
        advertiser=advertiser, quotas=QuotaBook(), waiting_line=waiting_line,
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
    return controller
