"""List-then-watch of one kind, read as raw JSON: the informer both
components feed their caches from.

Why not Kopf's watch or kubernetes-asyncio's `Watch`: Kopf runs every event
through its per-object workers, cause detection and handler machinery (at 200
nodes that was over half of the operator's CPU, for handlers that only hand
the object to a cache), and `Watch` turns pods into client model objects.
Here an event costs one `orjson.loads` (a third of `json.loads` for a pod)
and one handler call.

- The list is paged (`limit`/`continue`); a `continue` token that expired
  (410) restarts it.
- Every watch resumes from the last resourceVersion seen (bookmarks keep it
  fresh), so no event is lost or replayed across reconnects.
- 410 Gone (history compacted): re-list. Objects the cache held that the new
  list lacks are handed to the handler as DELETED, every listed object as
  SYNC.
- A stream that ends at its server-side timeout is resumed; one that goes
  silent past it (client timeout) is treated as broken and re-listed.
- API errors: exponential backoff with jitter, capped. Nothing raises out of
  `run` but cancellation.

`keep` decides what the informer remembers of an object (a slim copy, or None
for objects the component does not manage: they cost no memory and reach the
handler only while it remembered them, i.e. for their last event).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.faults import fault, log_retry
from vnpu_common.kube.paging import pages
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire.types import Raw

log = logging.getLogger(__name__)

# (event type, object) -> None; type is ADDED, MODIFIED, DELETED or SYNC.
Handler = Callable[[str, Raw], Awaitable[None]]
# A kubernetes-asyncio list method with its positional arguments bound.
ListCall = Callable[..., Awaitable[Any]]

ADDED, MODIFIED, DELETED, SYNC = "ADDED", "MODIFIED", "DELETED", "SYNC"
PAGE_SIZE = 500


def key_of(obj: Mapping[str, Any]) -> str:
    """namespace/name (cluster-scoped objects: /name)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def everything(obj: Raw) -> Raw:
    return obj


def _why(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"API error {exc.status} {exc.reason}"
    return fault(exc)


class GoneError(Exception):
    """The server no longer has the resourceVersion asked for (410)."""


class Informer:
    def __init__(
        self,
        name: str,
        list_call: ListCall,
        handler: Handler,
        *,
        label_selector: str | None = None,
        keep: Callable[[Raw], Raw | None] = everything,
        key: Callable[[Raw], str] = key_of,
        timeout_seconds: int = 300,
        retry_max_seconds: float = 30.0,
        page_size: int = PAGE_SIZE,
        listed: Callable[[], None] | None = None,
        stream_first_list: bool = False,
    ) -> None:
        self.name = name
        self._list_call = list_call
        self._handler = handler
        self._selector = {"label_selector": label_selector} if label_selector else {}
        self._keep = keep
        self._key = key
        self._timeout = timeout_seconds
        self._retry = Backoff(base=1.0, cap=retry_max_seconds, jitter=0.5)
        self._page_size = page_size
        self._listed = listed
        self._stream = stream_first_list
        self.cache: dict[str, Raw] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.relists = 0
        self.errors = 0
        self.events = 0

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
            except GoneError:
                log.info("%s watch expired (410 Gone); re-listing", self.name)
                self._broken()
            except Exception as exc:
                failures += 1
                self.errors += 1
                self._broken()
                await self._backoff(failures, exc)

    def _broken(self) -> None:
        self.synced.clear()
        self.resource_version = None

    async def _backoff(self, failures: int, exc: Exception) -> None:
        delay = self._retry.delay(failures)
        # An API answer is news (a 403 names missing RBAC), never a bug of ours.
        log_retry(log, f"{self.name} watch", exc, delay, expected=(ApiException,), describe=_why)
        await asyncio.sleep(delay)

    async def _fetch(self, token: str | None) -> Raw:
        page = {"_continue": token} if token else {}
        result: Raw = await call_json(
            self._list_call, limit=self._page_size, **self._selector, **page
        )
        return result

    async def _pages(self) -> tuple[list[Raw], str]:
        items: list[Raw] = []
        last: Raw = {}
        async for fresh, last in pages(self._fetch, self.name):
            if fresh:
                items = []
            items.extend(last.get("items") or [])
        return items, str(last["metadata"]["resourceVersion"])

    async def _list(self) -> None:
        if self._stream and not self.cache:
            await self._list_streamed()
            return
        items, version = await self._pages()
        fresh: dict[str, Raw] = {}
        listed: list[Raw] = []
        for obj in items:
            kept = self._keep(obj)
            if kept is not None:
                fresh[self._key(obj)] = kept
                listed.append(obj)
        gone = [obj for k, obj in self.cache.items() if k not in fresh]
        self._took(fresh, version)
        for obj in gone:
            await self._handler(DELETED, obj)
        for obj in listed:
            await self._handler(SYNC, obj)
        self._done_listing()

    def _took(self, cache: dict[str, Raw], version: str) -> None:
        """A list's result becomes the cache, its version the watch's start."""
        self.cache = cache
        self.resource_version = version
        self.relists += 1

    def _done_listing(self) -> None:
        self.synced.set()
        if self._listed is not None:
            self._listed()

    async def _list_streamed(self) -> None:
        """A list with nothing cached yet, handed on page by page: the whole
        list held at once was most of a cold start's memory (10000 vNPU pods:
        518 MB at ready against 314 MB running). Nothing cached means nothing
        can be gone, so no DELETED has to go before the SYNCs; only a list
        started again (an expired continue token) can leave objects handed on
        from the first try that the second lacks, and those are handed on as
        DELETED at its end. For components that act on nothing before every
        informer has listed (the operator's controller)."""
        handed: dict[str, Raw] = {}
        fresh_keys: dict[str, Raw] = {}
        version = ""
        async for fresh, page in pages(self._fetch, self.name):
            if fresh:
                fresh_keys = {}
            for obj in page.get("items") or []:
                kept = self._keep(obj)
                if kept is None:
                    continue
                key = self._key(obj)
                fresh_keys[key] = handed[key] = kept
                await self._handler(SYNC, obj)
            version = str(page["metadata"]["resourceVersion"])
        self._took(fresh_keys, version)
        for key, kept in handed.items():
            if key not in fresh_keys:
                await self._handler(DELETED, kept)
        self._done_listing()

    async def _watch(self) -> None:
        resp = await self._list_call(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout,
            _request_timeout=self._timeout + 30,
            _preload_content=False,
            **self._selector,
        )
        try:
            if resp.status == 410:
                raise GoneError()
            if not 200 <= resp.status <= 299:
                raise ApiException(status=resp.status, reason=resp.reason)
            while line := await resp.content.readline():
                if line.strip():
                    await self._event(orjson.loads(line))
        except BaseException:
            # A stream left mid-way must not go back to the pool: the next
            # request on that connection would read the rest of it.
            resp.close()
            raise
        resp.release()

    async def _event(self, event: Raw) -> None:
        kind = event.get("type")
        obj: Raw = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise GoneError()
            raise ApiException(status=code or 500, reason=obj.get("message") or "watch error")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = version
        if kind == "BOOKMARK" or kind not in (ADDED, MODIFIED, DELETED):
            return
        self.events += 1
        key = self._key(obj)
        if kind == DELETED:
            if self.cache.pop(key, None) is None and self._keep(obj) is None:
                return  # never managed: not the handler's business
        elif (kept := self._keep(obj)) is not None:
            self.cache[key] = kept
        elif self.cache.pop(key, None) is None:
            return
        await self._handler(kind, obj)
