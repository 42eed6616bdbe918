"""The operator's caches converge to the server after any lost event.

Kopf re-lists a resource after a broken watch (410 Gone, an API server
restart) and hands every listed object to the handlers again, so additions
and changes missed meanwhile do arrive. Deletions do not: an object deleted
while the watch was down is simply absent from the new list, and Kopf does
not compare (client-go's informers do, and emit DeletedFinalStateUnknown).
Seen in the wild: an API server killed during a churn left pods Terminating
for good, their allocations gone but still in the operator's cache.

So every `interval` seconds each watched kind is listed again, metadata only
(names and resourceVersions, no specs), and every cached object that the
list no longer shows although the list is newer than the cached copy is fed
to the controller as deleted. Pods are listed by the label the webhook puts
on the pods it admits; a cached pod missing from that list is confirmed gone
by a GET first (one admitted before the label existed is not gone).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.faults import log_retry
from vnpu_common.kube.paging import pages
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.controller import Controller
from vnpu_operator.inventories import Inventories
from vnpu_operator.slim import resource_version

log = logging.getLogger(__name__)

# Metadata only, no specs or statuses: still a kilobyte or two an object
# with managedFields, so the lists are paged. At 1000 nodes and 2000 pods one
# unpaged pass held about 100 MB at once, the operator's peak memory.
_METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
PAGE_SIZE = 200
# The pass's requests are spread over this share of the interval. Back to
# back, a pass at 1000 nodes took the API server 1.1 to 1.8 s of a 2-core
# machine's CPU at once, and 80 to 90% of a churn's slowest pods overlapped
# it (against 4 to 6% of all pods); spread, it costs the same in small bites
# that queue in front of nobody's writes for long.
SPREAD = 0.25


@dataclass(frozen=True)
class Listing:
    """What the server holds of one kind: the list's resourceVersion and the
    keys ("namespace/name", or "name" for cluster-scoped kinds) it shows."""

    version: int | None
    keys: frozenset[str]


def _key(item: Mapping[str, Any]) -> str:
    meta = item.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


def stale(
    cached: Mapping[str, Raw],
    listing: Listing,
    key: Callable[[Raw], str],
    missing_before: frozenset[str] = frozenset(),
) -> list[Raw]:
    """The cached objects the listing proves deleted: absent from it, and
    either last seen at a resourceVersion the list is not older than (one
    seen after the list was taken may simply be newer than it) or absent
    from the previous listing too (for copies that keep no resourceVersion:
    the second list is newer than anything seen before the first)."""
    gone = []
    for obj in cached.values():
        k = key(obj)
        if k in listing.keys:
            continue
        seen = resource_version(obj)
        newer = listing.version is not None and seen is not None and seen <= listing.version
        if newer or k in missing_before:
            gone.append(obj)
    return gone


@dataclass
class Kind:
    """One cached kind: how to list it, its cache, and where deletions go."""

    name: str
    path: str
    cache: Callable[[], Mapping[str, Raw]]
    gone: Callable[[Raw], None]
    label_selector: str | None = None
    # For pods: confirm each missing one with a GET before forgetting it.
    confirm: Callable[[Raw], Awaitable[bool]] | None = None


class Convergence:
    def __init__(
        self,
        api_client: client.ApiClient,
        kinds: list[Kind],
        *,
        interval: float,
        retry_max: float,
        ready: Callable[[], bool] = lambda: True,
        page_size: int = PAGE_SIZE,
        spread: float = SPREAD,
    ) -> None:
        """Passes start once `ready()` (the caches hold a first full listing)."""
        self.api_client = api_client
        self.page_size = page_size
        self.spread = spread
        self.ready = ready
        self.kinds = kinds
        self.interval = interval
        self.passes = 0
        self.forgotten = 0
        self._missing: dict[str, frozenset[str]] = {}
        self._backoff = Backoff(base=1.0, cap=retry_max)

    def gap(self) -> float:
        """Seconds between two requests of a pass: `spread` of the interval
        over the pages the caches' sizes predict (the lists show about what
        the caches hold)."""
        requests = sum(len(kind.cache()) // self.page_size + 1 for kind in self.kinds)
        return self.interval * self.spread / max(1, requests)

    async def list_keys(self, kind: Kind, gap: float = 0.0) -> Listing:
        """Every key of `kind` as of one resourceVersion (the pages of a
        list share its snapshot), `gap` seconds between pages."""

        async def fetch(token: str | None) -> Raw:
            if token:
                await asyncio.sleep(gap)
            query = [("limit", str(self.page_size))]
            if kind.label_selector:
                query.append(("labelSelector", kind.label_selector))
            if token:
                query.append(("continue", token))
            fn = functools.partial(
                self.api_client.call_api,
                kind.path,
                "GET",
                query_params=query,
                header_params={"Accept": _METADATA_ONLY},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
            page: Raw = await call_json(fn)
            return page

        keys: set[str] = set()
        last: Raw = {}
        async for fresh, last in pages(fetch, kind.name):
            if fresh:
                keys = set()
            keys.update(_key(i) for i in last.get("items") or [])
        return Listing(resource_version(last), frozenset(keys))

    async def converge(self) -> int:
        """One pass over every kind; returns how many cached objects it
        found deleted."""
        found = 0
        gap = self.gap()
        for i, kind in enumerate(self.kinds):
            if i:
                await asyncio.sleep(gap)
            listing = await self.list_keys(kind, gap)
            cache = kind.cache()
            missing = frozenset(_key(o) for o in cache.values()) - listing.keys
            previously = self._missing.get(kind.name, frozenset())
            self._missing[kind.name] = missing
            for obj in stale(cache, listing, _key, previously):
                if kind.confirm is not None and not await kind.confirm(obj):
                    continue
                log.warning(
                    "%s %s was deleted without a watch event reaching us; forgetting it",
                    kind.name,
                    _key(obj),
                )
                kind.gone(obj)
                found += 1
        self.passes += 1
        self.forgotten += found
        return found

    async def run(self) -> None:
        """Converges every `interval` seconds until cancelled; failures are
        retried with backoff and never end the loop."""
        failures = 0
        while True:
            delay = self.interval
            try:
                if self.ready():
                    await self.converge()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = self._backoff.delay(failures)
                log_retry(log, "cache convergence", exc, delay, expected=(ApiException,))
            await asyncio.sleep(delay)


def for_controller(
    controller: Controller,
    inventories: Inventories,
    pod_gone: Callable[[Raw], Awaitable[bool]],
    api_client: client.ApiClient,
    *,
    interval: float,
    retry_max: float,
) -> Convergence:
    """Every kind the operator's caches hold, fed back into `controller` and
    `inventories`; `pod_gone` confirms a pod's absence before it is forgotten."""
    ours = f"/apis/{names.GROUP}/{names.VERSION}"
    kinds = [
        Kind(
            "pod",
            "/api/v1/pods",
            lambda: controller.pods,
            lambda obj: controller.pod_event("DELETED", obj),
            label_selector=f"{names.LABEL_MANAGED}=true",
            confirm=pod_gone,
        ),
        Kind(
            "allocation",
            f"{ours}/{names.ALLOCATION_PLURAL}",
            lambda: controller.allocs,
            controller.allocation_gone,
        ),
        Kind(
            "vnpunode",
            f"{ours}/{names.NODE_PLURAL}",
            lambda: inventories.vnpunodes,
            lambda obj: inventories.vnpunode_event("DELETED", obj),
        ),
        Kind(
            "node",
            "/api/v1/nodes",
            lambda: inventories.nodes,
            lambda obj: inventories.node_event("DELETED", obj),
        ),
    ]
    return Convergence(
        api_client, kinds, interval=interval, retry_max=retry_max, ready=controller.is_synced
    )
