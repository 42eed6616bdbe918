"""`vnpu-operator`: admission webhooks, placement and the allocation
lifecycle. Every replica keeps the caches and answers the webhook; the one
that holds the leader Lease (leader.py) reconciles and writes. Kopf runs
standalone (docs/ARCHITECTURE.md, 'What Kopf does here')."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common import __version__, eventloop, gcfreeze, memory, names
from vnpu_common.apiclient import api_client as new_api_client
from vnpu_common.http import serve_component
from vnpu_common.logs import configure_logging
from vnpu_common.rawcall import call_json
from vnpu_common.startup import check_port, load_kube_config
from vnpu_operator.admission.server import WebhookServer
from vnpu_operator.config import OperatorSettings, parse_args
from vnpu_operator.convergence import for_controller
from vnpu_operator.handlers import register
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.leader import Leadership
from vnpu_operator.leases import LeaseWatch
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.watches import (
    allocation_informer,
    claim_informer,
    node_informer,
    pod_informer,
    vnpunode_informer,
)
from vnpu_operator.wiring import build_claims, build_controller, follow_leadership

log = logging.getLogger("vnpu_operator")
PROG = "vnpu-operator"


async def serves_resource_api(api_client: client.ApiClient) -> bool:
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


async def run(settings: OperatorSettings) -> None:
    # A port in use or no cluster: one line and exit 1 (vnpu_common.startup).
    check_port(PROG, settings.metrics_host, settings.metrics_port, "--metrics-port")
    check_port(PROG, settings.webhook_host, settings.webhook_port, "--webhook-port")
    await load_kube_config(PROG, settings.kubeconfig)
    if settings.kubeconfig:
        # Kopf's login reads the same file through kubernetes-asyncio.
        os.environ["KUBECONFIG"] = str(settings.kubeconfig)
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
    controller = build_controller(api, settings, metrics)
    follow_leadership(controller, leadership)
    webhook = WebhookServer(settings, controller.offered_templates, controller.quotas, metrics)
    runner = await serve_component(
        PROG,
        settings,
        api_client,
        metrics.registry,
        lambda: controller.synced and not webhook.draining,
        lambda: "stopping" if webhook.draining else "caches not synced",
    )
    metrics.watch_certificate(webhook.cert_not_after)
    await webhook.start()
    await webhook.register(api_client)

    registry = kopf.OperatorRegistry()
    leases = LeaseWatch(
        client.CoordinationV1Api(api_client),
        settings.agent_namespace,
        controller.inventories.leases,
        retry_max=settings.retry_max_seconds,
        timeout_seconds=settings.watch_timeout_seconds,
    )
    convergence = for_controller(
        controller,
        api_client,
        interval=settings.converge_seconds,
        retry_max=settings.retry_max_seconds,
    )
    claims = None
    if settings.dra and await serves_resource_api(api_client):
        claims = build_claims(api, api_client, controller, metrics, leadership)
    informers = [
        vnpunode_informer(api_client, controller, settings),
        node_informer(api_client, controller, settings),
        pod_informer(api_client, controller, settings),
        allocation_informer(api_client, controller, settings, claims),
    ]
    if claims is not None:
        informers.append(claim_informer(api_client, claims, settings))

    async def stop_serving() -> None:
        await webhook.drain(settings.webhook_drain_seconds)
        await webhook.stop()

    register(
        registry, controller, settings, leases, convergence, informers, leadership, stop_serving
    )
    trimming = asyncio.create_task(memory.trimmer().run(), name="memory-trim")
    # The caches synced are most of the heap, and live as long as the process.
    freezing = asyncio.create_task(
        gcfreeze.Freezer(controller.synced_event).run(), name="gc-freeze"
    )
    try:
        await kopf.operator(registry=registry, clusterwide=True, standalone=True)
    finally:
        trimming.cancel()
        freezing.cancel()
        await webhook.stop()
        await runner.cleanup()
        await api_client.close()


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    configure_logging(settings.log_level, settings.log_format)
    for deprecation in settings.deprecations():
        log.warning("%s", deprecation)
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(run(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
