"""List-then-watch of this agent's objects, selected by the `vnpu.io/node`
label of its node(s): the allocations it serves and its own VNPUNodes.

Keeps a cache that is *synced* only between a successful list and the next
broken stream. The garbage collector reads `synced` and collects nothing
while it is False: an allocation created while the watch was down must not
look like an orphan.

- resourceVersion: every watch resumes from the last one seen (bookmarks
  keep it fresh), so no event is lost or replayed across reconnects;
- 410 Gone (history compacted): re-list;
- a stream that ends at its server-side timeout is resumed; one that goes
  silent past it (client timeout) is treated as broken and re-listed;
- API errors: exponential backoff with jitter, capped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common import names
from vnpu_common.backoff import Backoff

log = logging.getLogger(__name__)

# (event type, object) -> None; type is ADDED, MODIFIED, DELETED or SYNC
# (SYNC: the object was in a fresh list; DELETED is also sent for objects
# that vanished between two lists).
Handler = Callable[[str, dict[str, Any]], Awaitable[None]]


def label_selector(nodes: Iterable[str]) -> str:
    node_list = sorted(set(nodes))
    if len(node_list) == 1:
        return f"{names.LABEL_NODE}={node_list[0]}"
    return f"{names.LABEL_NODE} in ({','.join(node_list)})"


def key_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class ListWatcher:
    """One label-selected list-then-watch of a vnpu.io resource, all
    namespaces (or cluster-scoped)."""

    def __init__(
        self,
        api: client.CustomObjectsApi,
        plural: str,
        nodes: Iterable[str],
        handler: Handler,
        *,
        timeout_seconds: int = 300,
        retry_max_seconds: float = 30.0,
    ) -> None:
        self._api = api
        self.plural = plural
        self.selector = label_selector(nodes)
        self._handler = handler
        self._timeout = timeout_seconds
        self._retry = Backoff(base=1.0, cap=retry_max_seconds, jitter=0.5)
        self.cache: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.relists = 0
        self.errors = 0

    async def run(self) -> None:
        """Runs until cancelled; never raises for API trouble."""
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
                failures = 0
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s watch expired (410 Gone); re-listing", self.plural)
                    self._broken()
                    continue
                failures += 1
                self.errors += 1
                self._broken()
                await self._backoff(failures, f"API error {exc.status} {exc.reason}")
            except Exception as exc:
                failures += 1
                self.errors += 1
                self._broken()
                await self._backoff(failures, f"{type(exc).__name__}: {exc}")

    def _broken(self) -> None:
        self.synced.clear()
        self.resource_version = None

    async def _backoff(self, failures: int, why: str) -> None:
        delay = self._retry.delay(failures)
        log.warning("%s watch failed (%s); retrying in %.1fs", self.plural, why, delay)
        await asyncio.sleep(delay)

    async def _list(self) -> None:
        result = await self._api.list_cluster_custom_object(
            names.GROUP, names.VERSION, self.plural, label_selector=self.selector
        )
        fresh = {key_of(obj): obj for obj in result.get("items", [])}
        gone = [obj for k, obj in self.cache.items() if k not in fresh]
        self.cache = fresh
        self.resource_version = result["metadata"]["resourceVersion"]
        self.relists += 1
        for obj in gone:
            await self._handler("DELETED", obj)
        for obj in fresh.values():
            await self._handler("SYNC", obj)
        self.synced.set()

    async def _watch(self) -> None:
        w = watch.Watch()
        try:
            stream = w.stream(
                self._api.list_cluster_custom_object,
                names.GROUP,
                names.VERSION,
                self.plural,
                label_selector=self.selector,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._timeout,
                _request_timeout=self._timeout + 30,
            )
            async for event in stream:
                kind = event["type"]
                obj: dict[str, Any] = event["object"]
                rv = obj.get("metadata", {}).get("resourceVersion")
                if rv:
                    self.resource_version = rv
                if kind == "BOOKMARK":
                    continue
                key = key_of(obj)
                if kind == "DELETED":
                    self.cache.pop(key, None)
                else:
                    self.cache[key] = obj
                await self._handler(kind, obj)
        finally:
            await w.close()


class AllocationWatcher(ListWatcher):
    """The allocations of this agent's node(s)."""

    def __init__(
        self,
        api: client.CustomObjectsApi,
        nodes: Iterable[str],
        handler: Handler,
        *,
        timeout_seconds: int = 300,
        retry_max_seconds: float = 30.0,
    ) -> None:
        super().__init__(
            api,
            names.ALLOCATION_PLURAL,
            nodes,
            handler,
            timeout_seconds=timeout_seconds,
            retry_max_seconds=retry_max_seconds,
        )


class NodeWatcher(ListWatcher):
    """This agent's own VNPUNodes: what the server holds of the inventory it
    publishes, so that a VNPUNode changed or removed by someone else is
    noticed (NodeAgent.on_node_event)."""

    def __init__(
        self,
        api: client.CustomObjectsApi,
        nodes: Iterable[str],
        handler: Handler,
        *,
        timeout_seconds: int = 300,
        retry_max_seconds: float = 30.0,
    ) -> None:
        super().__init__(
            api,
            names.NODE_PLURAL,
            nodes,
            handler,
            timeout_seconds=timeout_seconds,
            retry_max_seconds=retry_max_seconds,
        )
