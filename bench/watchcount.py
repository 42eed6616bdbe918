"""Watch events and bytes each component receives, counted from the bench's
side: a watch with the component's own parameters (kind, scope, label
selector) gets the same events and the same JSON the component's watch does,
without touching the component.

The operator's informers (vnpu_operator/watches.py) watch Nodes,
VNPUAllocations and VNPUNodes cluster-wide with no selector, and only the
pods labelled `vnpu.io/managed=true` (`pod_informer`: the webhook labels
every pod it admits, so an ordinary pod reaches no operator watch); each
agent process watches the allocations and VNPUNodes labelled with its
nodes (vnpu_agent/watcher.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_agent.watcher import label_selector
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names

BOOKMARK = b'"type":"BOOKMARK"'
# The operator's pod watch selects what watches.pod_informer selects.
MANAGED_PODS = f"{names.LABEL_MANAGED}=true"


@dataclass
class Tally:
    """Events (bookmarks apart) and bytes of one watch's stream."""

    events: int = 0
    bookmarks: int = 0
    nbytes: int = 0
    by_type: dict[str, int] = field(default_factory=dict)

    def line(self, raw: bytes) -> None:
        """One line of a watch stream (one event); blank keep-alives count for nothing."""
        if not raw.strip():
            return
        self.nbytes += len(raw)
        # The type is the first field the API server writes; no need to parse the object.
        head = raw[:40]
        if BOOKMARK in head:
            self.bookmarks += 1
            return
        self.events += 1
        kind = head.split(b'"type":"', 1)[-1].split(b'"', 1)[0].decode(errors="replace")
        self.by_type[kind] = self.by_type.get(kind, 0) + 1


@dataclass(frozen=True)
class WatchSpec:
    component: str  # "operator" or "agent"
    kind: str  # pods, nodes, vnpuallocations, vnpunodes
    selector: str = ""


def component_watches(agent_shards: Iterable[list[str]]) -> list[WatchSpec]:
    """The watches of the operator and of each agent process (one shard of nodes each)."""
    out = [
        WatchSpec("operator", "pods", MANAGED_PODS),
        WatchSpec("operator", "nodes"),
        WatchSpec("operator", names.ALLOCATION_PLURAL),
        WatchSpec("operator", names.NODE_PLURAL),
    ]
    for shard in agent_shards:
        sel = label_selector(shard)
        out += [
            WatchSpec("agent", names.ALLOCATION_PLURAL, sel),
            WatchSpec("agent", names.NODE_PLURAL, sel),
        ]
    return out


def per_pod(tallies: Iterable[tuple[WatchSpec, Tally]], pods: int) -> dict[str, Any]:
    """component -> events and bytes per pod, in total and by kind."""
    out: dict[str, Any] = {}
    n = max(1, pods)
    for spec, t in tallies:
        c = out.setdefault(spec.component, {"events": 0.0, "bytes": 0.0, "by_kind": {}})
        c["events"] += t.events / n
        c["bytes"] += t.nbytes / n
        k = c["by_kind"].setdefault(spec.kind, {"events": 0.0, "bytes": 0.0, "bookmarks": 0})
        k["events"] += t.events / n
        k["bytes"] += t.nbytes / n
        k["bookmarks"] += t.bookmarks
    return out


class Counting:
    """Runs the watches of `specs` and tallies their streams until stopped."""

    def __init__(self, api: client.ApiClient, specs: list[WatchSpec]) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.tallies = [(s, Tally()) for s in specs]
        self.tasks: list[asyncio.Task[None]] = []
        self.started = 0

    def _list_fn(self, spec: WatchSpec) -> Callable[..., Awaitable[Any]]:
        if spec.kind == "pods":
            return self.core.list_pod_for_all_namespaces
        if spec.kind == "nodes":
            return self.core.list_node

        async def custom(**kw: Any) -> Any:
            return await self.custom.list_cluster_custom_object(
                names.GROUP, names.VERSION, spec.kind, **kw
            )

        return custom

    async def start(self) -> None:
        """Lists each kind once (for the resourceVersion the watch starts at),
        then watches; returns once every watch is listening."""
        ready = asyncio.Event()

        async def one(spec: WatchSpec, tally: Tally) -> None:
            fn = self._list_fn(spec)
            kw = {"label_selector": spec.selector} if spec.selector else {}
            listed = await call_json(fn, limit=1, **kw)
            rv = str(listed["metadata"]["resourceVersion"])
            first = True
            while True:
                try:
                    resp = await fn(
                        watch=True, resource_version=rv, allow_watch_bookmarks=True,
                        timeout_seconds=600, _preload_content=False, _request_timeout=700, **kw,
                    )  # fmt: skip
                    if first:
                        first = False
                        self.started += 1
                        if self.started == len(self.tallies):
                            ready.set()
                    last = b""
                    try:
                        async for line in resp.content:
                            if b'"type":"ERROR"' in line[:40]:  # 410 Gone: start over
                                listed = await call_json(fn, limit=1, **kw)
                                last = b""
                                rv = str(listed["metadata"]["resourceVersion"])
                                break
                            tally.line(line)
                            last = line if line.strip() else last
                    finally:
                        resp.release()
                        # Only a resumed watch needs the position: one parse per stream.
                        rv = _resource_version(last, rv) if last else rv
                except (TimeoutError, OSError, ApiException):
                    await asyncio.sleep(0.2)

        self.tasks = [asyncio.create_task(one(s, t)) for s, t in self.tallies]
        await asyncio.wait_for(ready.wait(), timeout=60)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def _resource_version(line: bytes, default: str) -> str:
    # Only for a resumed watch: the rare reconnect pays the parse, not every line.
    try:
        meta = (json.loads(line).get("object") or {}).get("metadata") or {}
    except ValueError:
        return default
    return str(meta.get("resourceVersion") or default)
