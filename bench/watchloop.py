"""The benchmark's own watches: list once, then watch from that
resourceVersion for good, stamping every event with the time it arrived."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.rawcall import call_json

Handler = Callable[[str, dict[str, Any], float], None]


async def watch_forever(
    lister: Callable[..., Any], handle: Handler, synced: asyncio.Event | None = None
) -> None:
    """Lists once (for a resourceVersion), then watches from there for good,
    calling `handle(type, object, monotonic time)` for every event but
    bookmarks; a watch that expired (410) lists again. `lister` is a list
    call with its path arguments bound."""

    async def relist() -> str:
        data = await call_json(lister)
        return str(data["metadata"]["resourceVersion"])

    rv = await relist()
    if synced is not None:
        synced.set()
    while True:
        try:
            # Unread aiohttp response (`_preload_content=False`), not the model.
            resp: Any = await lister(
                watch=True, resource_version=rv, allow_watch_bookmarks=True,
                timeout_seconds=240, _preload_content=False, _request_timeout=300,
            )  # fmt: skip
            async for line in resp.content:
                if not line.strip():
                    continue
                ev = orjson.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        rv = await relist()
                    break
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if ev.get("type") != "BOOKMARK":
                    handle(ev["type"], obj, time.monotonic())
            resp.release()
        except (TimeoutError, OSError, ApiException):
            await asyncio.sleep(0.2)
