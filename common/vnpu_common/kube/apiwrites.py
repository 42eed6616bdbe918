"""API writes, made and counted one way by both components.

A write goes through `rawcall` (no client models). One that fails is counted
in the component's `<prefix>_api_errors_total{operation,status}`, by the
HTTP status it answered or `none` (no answer: refused, reset, timed out),
unless the caller expects that answer: a status that says the work is done
or tells the caller what to do instead (AlreadyExists on a retried create,
NotFound on a delete, NotFound before a create) is not a failure. Every
failure is raised all the same, expected or not: what is retried, logged or
swallowed stays the caller's decision.

A write with a fence asks it twice: when the call starts, and again at the
last moment before its first byte goes out (`send_fence`, an aiohttp trace
on the client). Between the two a write may wait for a free connection or
a TLS handshake, and a process frozen there (SIGSTOP, a paused VM) would
otherwise send, once resumed, what it decided while it still led. After
the last ask the request's bytes are written without yielding to the event
loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from vnpu_common.kube import rawcall
from vnpu_common.wire import names
from vnpu_common.wire.patches import JSON_PATCH, finalizer_removal

# The status label of a failed write that got no HTTP answer.
NO_RESPONSE: Final = "none"
LABELS: Final = ("operation", "status")
# The answers to a finalizer's removal that leave nothing to do: gone, or a failed test.
_FINALIZER_DONE: Final = (404, 422)

# The statuses the caller acts on, or a test of the answer (a 429 may be a
# PodDisruptionBudget's refusal or the server's throttling).
Expected = Collection[int] | Callable[[ApiException], bool]


class FencedWrite(ApiException):
    """A write its fence kept unsent. Not a failed write: not counted."""

    def __init__(self, status: int = 0, reason: str | None = None) -> None:
        super().__init__(status=status, reason=reason)
        # kubernetes-asyncio decodes the body of every ApiException it passes on.
        self.body = b""


# The fence and operation of the write this task is making, for `send_fence`.
_SENDING: ContextVar[tuple[Callable[[str], None], str] | None] = ContextVar(
    "vnpu_fenced_write", default=None
)


async def _ask_again(session: aiohttp.ClientSession, context: object, params: object) -> None:
    sending = _SENDING.get()
    if sending is not None:
        fence, operation = sending
        fence(operation)


@contextlib.contextmanager
def fenced(fence: Callable[[str], None] | None, operation: str) -> Iterator[None]:
    """Within it, a request on a client that carries `send_fence` asks
    `fence(operation)` again just before its bytes are written."""
    if fence is None:
        yield
        return
    sending = _SENDING.set((fence, operation))
    try:
        yield
    finally:
        _SENDING.reset(sending)


def send_fence() -> aiohttp.TraceConfig:
    """The trace that asks a write's fence again just before its bytes are
    written: when the headers are (buffered, on a body-less request sent at
    once) and when the body is (with the buffered headers; on Python 3.11
    aiohttp writes it one event-loop turn after the headers). Requests made
    outside `Writes`, and writes without a fence, pass untouched. What the
    fence raises aborts the request unsent."""
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_ask_again)
    trace.on_request_chunk_sent.append(_ask_again)
    return trace


def error_counter(prefix: str, documentation: str, registry: CollectorRegistry) -> Counter:
    """`<prefix>_api_errors_total{operation,status}`: a handful of operations
    times the statuses the API server answers, so the series stay few."""
    return Counter(f"{prefix}_api_errors_total", documentation, LABELS, registry=registry)


def status_label(exc: BaseException) -> str:
    """The status label of a failure: its HTTP status, or `none`."""
    return str(exc.status) if isinstance(exc, ApiException) else NO_RESPONSE


def _is_expected(exc: ApiException, expected: Expected) -> bool:
    if callable(expected):
        return expected(exc)
    return exc.status in expected


class Writes:
    """Makes writes and counts the ones that fail in `errors`, a counter
    labelled (operation, status). `fence(operation)`, if given, is called
    when each write starts, and again just before it is sent where the
    client carries `send_fence`, and may raise a `FencedWrite` to keep it
    unsent (the operator's leader election: a replica that does not lead
    writes nothing); that is not counted as a failed write."""

    def __init__(self, errors: Counter, fence: Callable[[str], None] | None = None) -> None:
        self.errors = errors
        self.fence = fence

    def failed(self, operation: str, exc: BaseException) -> None:
        self.errors.labels(operation, status_label(exc)).inc()

    async def _counted(self, operation: str, request: Awaitable[Any], expected: Expected) -> Any:
        try:
            with fenced(self.fence, operation):
                return await request
        except FencedWrite:
            raise
        except ApiException as exc:
            if not _is_expected(exc, expected):
                self.failed(operation, exc)
            raise
        except Exception as exc:
            self.failed(operation, exc)
            raise

    async def call(
        self,
        operation: str,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        expected: Expected = (),
        **kwargs: Any,
    ) -> int:
        """`rawcall.call`, counted: the HTTP status; raises as it does."""
        if self.fence is not None:
            self.fence(operation)
        status: int = await self._counted(operation, rawcall.call(fn, *args, **kwargs), expected)
        return status

    async def call_json(
        self,
        operation: str,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        expected: Expected = (),
        **kwargs: Any,
    ) -> Any:
        """`rawcall.call_json`, counted: the answer's JSON; raises as it does."""
        if self.fence is not None:
            self.fence(operation)
        return await self._counted(operation, rawcall.call_json(fn, *args, **kwargs), expected)


async def remove_allocation_finalizer(
    writes: Writes, custom: client.CustomObjectsApi, meta: Mapping[str, Any]
) -> ApiException | None:
    """Takes our finalizer off a VNPUAllocation,
    guarded by `test`s of the uid and the list (`finalizer_removal`), so that a
    replaced object or a concurrent change fails the request instead of being
    overwritten. The agent calls it once the vNPU is destroyed, the operator
    for an allocation no agent will ever serve: one request, one way.

    None when the finalizer is off (or was not there); else the refusal whose
    answer leaves nothing to do now, not counted as a failure: 404 (the
    object is gone) or 422 (a test failed: a replaced object, or a changed
    list that the next event brings). Any other failure is counted and raised."""
    ops = finalizer_removal(meta, names.ALLOCATION_FINALIZER)
    if ops is None:
        return None
    try:
        await writes.call(
            "patch_allocation",
            custom.patch_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            meta["namespace"],
            names.ALLOCATION_PLURAL,
            meta["name"],
            ops,
            _content_type=JSON_PATCH,
            expected=_FINALIZER_DONE,
        )
    except ApiException as exc:
        if exc.status in _FINALIZER_DONE:
            return exc
        raise
    return None
