"""Kopf wiring: thin handlers that feed the controller, and Kopf's settings.

Economy rules (docs/DECISIONS.md, 'Performance at 200 nodes' and 'Watches
without Kopf's per-event cost'):
- Pods and allocations, nearly every event, are watched by informers
  (watches.py), started here and stopped with Kopf. Agent Leases are polled
  (leases.py).
- Kopf watches the low-rate kinds with event and index handlers only: it then
  keeps no progress or diff-base state, so it writes nothing.
- Index handlers on VNPUNodes and Nodes fill the controller's caches until
  they are complete; from then on the event handlers alone feed it. Kopf
  holds every event handler until all index handlers have listed once, so
  the first event handler call means Kopf's kinds are listed
  (`Controller.listed`). No pod is placed before the ledger holds every
  existing allocation (a restarted operator never double-books), and no
  allocation is taken for an orphan before every pod is known.
- Kopf's own finalizer and annotation names are ours, in case a later
  handler ever makes it persist something; its Event posting is WARNING+.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import kopf

from vnpu_common import names
from vnpu_common.informer import Informer
from vnpu_operator.config import OperatorSettings
from vnpu_operator.controller import SOURCES, Controller
from vnpu_operator.convergence import Convergence
from vnpu_operator.leases import LeasePoller
from vnpu_operator.slim import slim_object

log = logging.getLogger(__name__)

SOURCE_KOPF = SOURCES[0]


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf deep-copies every object on every event to diff it against the
    last handled state, for change-detecting (create/update/delete) handlers.
    We register none, so the copy is pure cost: at 200 nodes it was a sixth
    of the operator's CPU. Adding such a handler means removing this class."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def configure(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    settings.persistence.finalizer = names.KOPF_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=names.KOPF_ANNOTATIONS_PREFIX
    )
    settings.persistence.diffbase_storage = NoDiffBase(
        prefix=names.KOPF_ANNOTATIONS_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = ours.watch_timeout_seconds
    settings.watching.client_timeout = ours.watch_timeout_seconds + 30
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    # One discovery at start: no watch on CRDs and namespaces (and no RBAC for it).
    settings.scanning.disabled = True


def register(
    registry: kopf.OperatorRegistry,
    controller: Controller,
    ours: OperatorSettings,
    leases: LeasePoller,
    convergence: Convergence,
    informers: Sequence[Informer],
) -> None:
    """All handlers of the operator, bound to `controller`, and its other
    long-running tasks."""
    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, ours)
        # Kopf starts no watch before startup handlers return, so every
        # agent Lease is known before the caches can be called complete.
        if not tasks:
            tasks.append(asyncio.create_task(leases.run(), name="lease-poller"))
            tasks.append(asyncio.create_task(convergence.run(), name="convergence"))
            for informer in informers:
                tasks.append(asyncio.create_task(informer.run(), name=f"watch-{informer.name}"))
        await leases.listed.wait()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return await kopf.login_via_async_client(**kwargs)

    # Each kind has an index handler and an event handler. Until the caches
    # are complete the index handlers fill them: Kopf runs no event handler
    # before every indexed object has been through its index handler once,
    # so the first event handler call finds every cache complete. From then
    # on the index handlers are filtered out and the event handlers alone
    # feed the controller: Kopf's cost of executing a handler, paid twice
    # per event, was a tenth of the operator's CPU at 200 nodes.
    def listing(**_: Any) -> bool:
        return not controller.synced

    def deleted(event: kopf.RawEvent) -> bool:
        controller.listed(SOURCE_KOPF)
        return event["type"] == "DELETED"

    # ------------------------------------------------------ inventories
    @kopf.index(names.GROUP, names.VERSION, names.NODE_PLURAL, when=listing, registry=registry)
    async def vnpunodes_index(body: kopf.Body, **_: Any) -> None:
        controller.inventories.vnpunode_event(None, slim_object(body))

    @kopf.on.event(names.GROUP, names.VERSION, names.NODE_PLURAL, registry=registry)
    async def vnpunode_event(event: kopf.RawEvent, **_: Any) -> None:
        kind = "DELETED" if deleted(event) else None
        controller.inventories.vnpunode_event(kind, slim_object(event["object"]))

    # The controller keeps its own slim copies of Nodes (labels and taints;
    # the fields it reads), so these get Kopf's body as it is.
    @kopf.index("", "v1", "nodes", when=listing, registry=registry)
    async def nodes_index(body: kopf.Body, **_: Any) -> None:
        controller.inventories.node_event(None, body)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(event: kopf.RawEvent, **_: Any) -> None:
        kind = "DELETED" if deleted(event) else None
        controller.inventories.node_event(kind, event["object"])

    # The namespaces' vNPU quotas: the webhook refuses a pod over one in our words.
    @kopf.on.event("", "v1", "resourcequotas", registry=registry)
    async def quota_event(event: kopf.RawEvent, **_: Any) -> None:
        controller.quotas.seen(event["object"], deleted=deleted(event))
