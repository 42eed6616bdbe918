"""The classifier of expected faults and the one line a retry logs: one
WARNING line without a traceback for a fault a retry is there for, ERROR
with the traceback for anything else."""

from __future__ import annotations

import io
import logging
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube import rawcall
from vnpu_common.kube.apiwrites import FencedWrite
from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.faults import fault, is_expected, log_retry
from vnpu_common.kube.workqueue import WorkQueue
from vnpu_common.process.logs import configure_logging

log = logging.getLogger("vnpu_test.faults")


def _api(status: int, reason: str, message: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = (
        b'{"kind":"Status","message":"' + message.encode() + b'"}' if message is not None else b""
    )
    return exc


def _raised(exc: BaseException) -> BaseException:
    """`exc` as an except clause holds it: with a traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught


EXPECTED: list[BaseException] = [
    ConnectionResetError(104, "Connection reset by peer"),
    ConnectionRefusedError(111, "Connection refused"),
    BrokenPipeError(32, "Broken pipe"),
    TimeoutError(),
    aiohttp.ServerDisconnectedError(),
    aiohttp.ServerTimeoutError("Timeout on reading data from socket"),
    aiohttp.ClientOSError(104, "Connection reset by peer"),
    aiohttp.ClientPayloadError("Response payload is not completed"),
    aiohttp.ClientConnectionError("Connection closed"),
    *(_api(s, "x") for s in (409, 429, 500, 502, 503, 504)),
    FencedWrite(reason="not leading"),
]

NOT_EXPECTED: list[BaseException] = [
    ValueError("bad"),
    KeyError("metadata"),
    RuntimeError("changed under each of 5 registrations"),
    aiohttp.ServerFingerprintMismatch(b"a", b"b", "host", 443),
    *(_api(s, "x") for s in (400, 401, 403, 404, 410, 422)),
]


@pytest.mark.parametrize("exc", EXPECTED, ids=lambda e: fault(e))
def test_faults_a_retry_is_there_for_are_expected(exc: BaseException) -> None:
    assert is_expected(exc)


@pytest.mark.parametrize("exc", NOT_EXPECTED, ids=lambda e: fault(e))
def test_bugs_and_refusals_are_not_expected(exc: BaseException) -> None:
    assert not is_expected(exc)


class _Response:
    def __init__(self, status: int, reason: str, body: bytes) -> None:
        self.status, self.reason, self.headers, self._body = status, reason, {}, body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


@pytest.mark.parametrize(("status", "expected"), [(409, True), (429, True), (403, False)])
async def test_what_the_raw_call_layer_raises_is_classified(status: int, expected: bool) -> None:
    async def request(*_: Any, **__: Any) -> _Response:
        return _Response(status, "x", b'{"kind":"Status","message":"m"}')

    with pytest.raises(ApiException) as raised:
        await rawcall.call(request)
    assert is_expected(raised.value) is expected


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (
            ConnectionResetError(104, "Connection reset by peer"),
            "webhook certificate refresh failed (ConnectionResetError: [Errno 104] Connection "
            "reset by peer); retrying in 2.0 s",
        ),
        (
            _api(409, "Conflict", "the object has been modified"),
            "webhook certificate refresh failed (409 Conflict: the object has been modified); "
            "retrying in 2.0 s",
        ),
        (
            _api(429, "Too Many Requests"),
            "webhook certificate refresh failed (429 Too Many Requests); retrying in 2.0 s",
        ),
        (
            TimeoutError(),
            "webhook certificate refresh failed (TimeoutError); retrying in 2.0 s",
        ),
    ],
)
def test_an_expected_fault_is_one_warning_line_without_a_traceback(
    exc: BaseException, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_retry(log, "webhook certificate refresh", _raised(exc), 2.0)
    [record] = caplog.records
    assert (record.levelno, record.getMessage()) == (logging.WARNING, line)
    assert record.exc_info is None
    # The record names the line that retries, not the helper's.
    assert record.funcName == "test_an_expected_fault_is_one_warning_line_without_a_traceback"


def test_anything_else_is_an_error_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    exc = _raised(ValueError("no CA in the bundle"))
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_retry(log, "webhook certificate refresh", exc, 60.0)
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "webhook certificate refresh failed (ValueError: no CA in the bundle); retrying in 60.0 s"
    )
    assert record.exc_info is not None
    assert record.exc_info[1] is exc
    assert "Traceback (most recent call last)" in caplog.text


def test_the_callers_own_expected_kinds_the_attempt_and_an_unknown_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_retry(log, "pod u1", _raised(_api(403, "Forbidden")), 0.9, attempt=3,
                  expected=(ApiException,))  # fmt: skip
        log_retry(log, "VNPUNode n1: status write", _raised(TimeoutError()), None)
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (logging.WARNING, "pod u1 failed (403 Forbidden); retry 3 in 0.9 s", None),
        (logging.WARNING, "VNPUNode n1: status write failed (TimeoutError); retrying later", None),
    ]


def test_a_text_log_gets_one_line_for_a_reset_and_a_traceback_for_a_bug() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("INFO", stream=stream)
    try:
        log_retry(log, "resync of n1", _raised(ConnectionResetError(104, "reset")), 5.0)
        warning = stream.getvalue()
        log_retry(log, "resync of n1", _raised(KeyError("chips")), 5.0)
        error = stream.getvalue()[len(warning) :]
    finally:
        for h in root.handlers[:]:
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
    assert warning.count("\n") == 1
    assert "Traceback" not in warning
    assert " WARNING vnpu_test.faults resync of n1 failed (ConnectionResetError: " in warning
    assert " ERROR vnpu_test.faults resync of n1 failed (KeyError: 'chips')" in error
    assert "Traceback (most recent call last)" in error


async def test_the_work_queue_logs_a_reset_as_a_line_and_a_bug_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faults: dict[str, Exception] = {
        "reset": aiohttp.ServerDisconnectedError(),
        "bug": ValueError("bad key"),
    }

    async def handler(key: str) -> None:
        raise faults[key]

    q = WorkQueue(handler, name="t", backoff=Backoff(base=60, cap=60, jitter=0.0))
    with caplog.at_level(logging.DEBUG, logger="vnpu_common.kube.workqueue"):
        q.add("reset")
        await q.idle()
        q.add("bug")
        await q.idle()
    q.close()
    reset, bug = caplog.records
    assert (reset.levelno, reset.getMessage(), reset.exc_info) == (
        logging.WARNING, "t reset failed (ServerDisconnectedError: Server disconnected); "
        "retry 1 in 60.0 s", None,
    )  # fmt: skip
    assert (bug.levelno, bug.getMessage()) == (
        logging.ERROR,
        "t bug failed (ValueError: bad key); retry 1 in 60.0 s",
    )
    assert bug.exc_info is not None
    assert bug.exc_info[1] is faults["bug"]
