"""Kopf wiring: the process's lifecycle, one thin handler, and Kopf's settings.

Economy rules (docs/DECISIONS.md, 'The operator and Kopf', 'Watches
without Kopf's per-event cost'):
- Every kind placement and the lifecycle read (VNPUNodes, Nodes, pods,
  allocations) is watched by an informer (watches.py), started here once
  every agent Lease has been listed (leases.py polls them), and stopped with
  Kopf. The controller is synced once all of them have listed.
- Kopf watches nothing: ResourceQuotas (the webhook's refusals) have an
  informer too. Kopf's watcher ended the process on a fault outside the ones
  it retries (uvloop's "File descriptor N is used by transport" while the API
  server was killed); an informer retries every fault.
- Kopf's own finalizer and annotation names are ours, in case a later
  handler ever makes it persist something; its Event posting is WARNING+.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import kopf

from vnpu_common.kube.informer import Informer
from vnpu_common.wire import names
from vnpu_operator.config import OperatorSettings
from vnpu_operator.controller import Controller
from vnpu_operator.convergence import Convergence
from vnpu_operator.leader import Leadership
from vnpu_operator.leases import LeaseWatch

log = logging.getLogger(__name__)


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
    leases: LeaseWatch,
    convergence: Convergence,
    informers: Sequence[Informer],
    leadership: Leadership | None = None,
    stop_serving: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """All handlers of the operator, bound to `controller`, and its other
    long-running tasks; `leadership` runs for the leader Lease once the
    caches are synced (a cold replica never takes over from a warm one) and
    hands it back at cleanup. `stop_serving` (the webhook's drain and stop)
    runs at cleanup after the hand-back, with the caches still watched."""
    # Kopf runs a startup handler again if it fails: each list is filled once.
    pollers: list[asyncio.Task[None]] = []
    watches: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, ours)
        if not pollers:
            pollers.append(asyncio.create_task(leases.run(), name="watch-leases"))
            pollers.append(asyncio.create_task(convergence.run(), name="convergence"))
            if leadership is not None:
                pollers.append(asyncio.create_task(elect(leadership), name="leader-election"))
        # Every agent Lease is known before any cache can be complete: a
        # node whose Lease was not listed yet would count as not live.
        await leases.listed.wait()
        if not watches:
            for informer in informers:
                watches.append(asyncio.create_task(informer.run(), name=f"watch-{informer.name}"))

    async def elect(leadership: Leadership) -> None:
        await controller.synced_event.wait()
        await leadership.run()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if leadership is not None:
            await leadership.release()
        if stop_serving is not None:
            # Here, not after kopf.operator returns: Kopf then cancels every task started
            # since its start that is still running, aiohttp's per-connection tasks among
            # them, cutting the API server's kept-alive webhook connections mid-admission.
            await stop_serving()
        tasks = [*pollers, *watches]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return await kopf.login_via_async_client(**kwargs)
