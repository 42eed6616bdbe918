"""One write helper for both components: a failed write is counted by
operation and status unless the caller expects that answer, and raised
either way (the caller decides what to retry, log or swallow)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from vnpu_common.kube.apiwrites import NO_RESPONSE, Writes, error_counter


class _Response:
    def __init__(self, status: int, body: bytes = b"{}") -> None:
        self.status = status
        self.reason = "Reason"
        self.headers: dict[str, str] = {}
        self._body = body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


def _answering(status: int, body: bytes = b"{}") -> Any:
    async def fn(*args: Any, **kwargs: Any) -> _Response:
        assert kwargs["_preload_content"] is False
        return _Response(status, body)

    return fn


async def _refused(*args: Any, **kwargs: Any) -> Any:
    raise ConnectionRefusedError


@pytest.fixture
def writes() -> tuple[Writes, CollectorRegistry]:
    registry = CollectorRegistry()
    return Writes(error_counter("vnpu_test", "Failed writes.", registry)), registry


def _count(registry: CollectorRegistry, operation: str, status: str) -> float | None:
    labels = {"operation": operation, "status": status}
    return registry.get_sample_value("vnpu_test_api_errors_total", labels)


async def test_a_write_that_succeeds_counts_nothing(
    writes: tuple[Writes, CollectorRegistry],
) -> None:
    w, registry = writes
    assert await w.call("patch", _answering(200)) == 200
    assert await w.call_json("patch", _answering(201, b'{"a": 1}')) == {"a": 1}
    assert _count(registry, "patch", "200") is None


async def test_a_failed_write_is_counted_by_status_and_raised(
    writes: tuple[Writes, CollectorRegistry],
) -> None:
    w, registry = writes
    for status in (409, 500):
        with pytest.raises(ApiException) as exc:
            await w.call("create", _answering(status))
        assert exc.value.status == status
    with pytest.raises(ConnectionRefusedError):
        await w.call_json("create", _refused)
    assert _count(registry, "create", "409") == 1
    assert _count(registry, "create", "500") == 1
    assert _count(registry, "create", NO_RESPONSE) == 1


async def test_an_expected_answer_is_raised_but_not_counted(
    writes: tuple[Writes, CollectorRegistry],
) -> None:
    w, registry = writes
    with pytest.raises(ApiException):
        await w.call("delete", _answering(404), expected=(404,))
    with pytest.raises(ApiException):
        await w.call_json("patch", _answering(422), expected=(404, 422))
    # A test of the answer: here, a 429 the caller reads as a refusal.
    with pytest.raises(ApiException):
        await w.call("evict", _answering(429), expected=lambda e: e.status == 429)
    with pytest.raises(ApiException):
        await w.call("delete", _answering(403), expected=(404,))
    assert _count(registry, "delete", "404") is None
    assert _count(registry, "patch", "422") is None
    assert _count(registry, "evict", "429") is None
    assert _count(registry, "delete", "403") == 1
