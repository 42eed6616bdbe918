"""Which faults a retry expects, and the one line it logs for one.

A replica cut off from the API server retries every call it makes, and each
failure used to come with a traceback at ERROR: an on-call read a network
blip as a crash. A fault the retry exists for (the connection refused, reset
or timed out, the server throttling or overloaded, a write that lost a race)
is logged as one WARNING line saying what failed, how, and when it is tried
again. Anything else is a bug or a misconfiguration: ERROR, with the
traceback, so that it can be reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube import rawcall
from vnpu_common.kube.apiwrites import FencedWrite

# Conflict (lost an optimistic race, or created twice), throttled, and the
# answers of an API server that is restarting, overloaded or behind a proxy
# whose backend is down.
EXPECTED_STATUSES: Final = frozenset({409, 429, 500, 502, 503, 504})

# No answer: refused, reset, disconnected, cut mid-body (a watch stream the
# server closed as it stopped), timed out. asyncio.TimeoutError is TimeoutError.
_NO_ANSWER: Final = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    ConnectionError,
    TimeoutError,
)

# Connection errors no retry cures: the server's certificate is not the one
# trusted. They are configuration, so they keep their traceback.
_NOT_TRANSIENT: Final = (
    aiohttp.ClientConnectorCertificateError,
    aiohttp.ServerFingerprintMismatch,
)


def is_expected(exc: BaseException) -> bool:
    """Whether `exc` is a fault a retry is there for (see the module doc).
    A write its leader fence kept unsent (`FencedWrite`: this replica no
    longer leads) is expected too."""
    if isinstance(exc, FencedWrite):
        return True
    if isinstance(exc, ApiException):
        return exc.status in EXPECTED_STATUSES
    if isinstance(exc, _NOT_TRANSIENT):
        return False
    return isinstance(exc, _NO_ANSWER)


def fault(exc: BaseException) -> str:
    """A fault in short: an API answer as its status, reason and message,
    anything else as its class and message (never a traceback, never an
    API answer's headers or body)."""
    if isinstance(exc, ApiException):
        return rawcall.describe(exc)
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def log_retry(
    log: logging.Logger,
    what: str,
    exc: BaseException,
    retry_in: float | None,
    *,
    attempt: int | None = None,
    expected: tuple[type[BaseException], ...] = (),
    describe: Callable[[BaseException], str] = fault,
) -> None:
    """Logs that `what` failed with `exc` and is tried again in `retry_in`
    seconds (None: at its next turn, e.g. the next resync).

    An expected fault (`is_expected`, or an instance of `expected`: a
    caller's own "this is news, not a bug") is one WARNING line, e.g.
    `webhook certificate refresh failed (ServerDisconnectedError: Server
    disconnected); retrying in 60.0 s`. Anything else is the same line at
    ERROR with the traceback. `attempt` numbers the retry ("retry 3 in").
    The record names the caller's line, not this function's."""
    if retry_in is None:
        when = "retrying later"
    elif attempt is None:
        when = f"retrying in {retry_in:.1f} s"
    else:
        when = f"retry {attempt} in {retry_in:.1f} s"
    if is_expected(exc) or isinstance(exc, expected):
        log.warning("%s failed (%s); %s", what, describe(exc), when, stacklevel=2)
    else:
        log.error("%s failed (%s); %s", what, describe(exc), when, exc_info=exc, stacklevel=2)
