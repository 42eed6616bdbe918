"""API calls whose answers are not turned into client model objects.

Every write answers with the object written, and kubernetes-asyncio turns
that answer into its model classes: for a pod, hundreds of nested objects
and every timestamp parsed by dateutil. The operator and the agent never
read those answers. At 200 nodes the conversion was a tenth of the
operator's CPU, so writes go through `call`, which takes the raw response
and raises the same `ApiException` the client would for a non-2xx status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from kubernetes_asyncio.client.exceptions import ApiException


async def _raw(fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> tuple[int, bytes]:
    # `_preload_content` and `_content_type` are runtime keywords the stubs
    # do not list; with the first off the client returns aiohttp's response
    # unread and unchecked.
    resp = await fn(*args, _preload_content=False, **kwargs)
    try:
        data: bytes = await resp.read()
    finally:
        resp.release()
    if not 200 <= resp.status <= 299:
        error = ApiException(status=resp.status, reason=resp.reason)
        error.body = data
        error.headers = resp.headers
        raise error
    return resp.status, data


def api_message(exc: ApiException) -> str:
    """The `message` of the Status object an API error answered with (what a
    policy or webhook said, e.g. "... is forbidden: ValidatingAdmissionPolicy
    ... denied request: ..."), or "" when the body is none."""
    body = exc.body
    if not body:
        return ""
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return str(message) if message else ""


def describe(exc: BaseException) -> str:
    """An error as a log line shows it: an API answer by status, reason and
    its Status' message (never the whole body, which may be an object),
    anything else as it is."""
    if not isinstance(exc, ApiException):
        return repr(exc)
    message = api_message(exc)
    if not message or message == exc.reason:
        return f"{exc.status} {exc.reason}"
    return f"{exc.status} {exc.reason}: {message}"


async def call(fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> int:
    """Makes the request; returns the HTTP status, raises ApiException."""
    status, _ = await _raw(fn, *args, **kwargs)
    return status


async def call_json(fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Makes the request and returns its JSON body as plain dicts and lists."""
    _, data = await _raw(fn, *args, **kwargs)
    return orjson.loads(data)
