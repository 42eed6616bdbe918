"""What a pod and the log are told when the operator's writes fail: the API
server's Status message, not its whole body nor only `403 Forbidden`, and
which reason (WriteRefused for a refusal, APIError for the rest)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from test_controller import FakeApi, World, pod

from vnpu_common.kube.rawcall import api_message, describe
from vnpu_common.wire import names
from vnpu_operator.notices import write_failure

POLICY = (
    'vnpuallocations.vnpu.io "p-0" is forbidden: ValidatingAdmissionPolicy '
    "'allocation-protection' denied request: VNPUAllocations are created by the "
    "vnpu-operator only, not by admin"
)


def _error(status: int, reason: str, body: bytes | str | None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = body  # type: ignore[assignment]  # the client's own exceptions carry text
    return exc


def _status(message: str) -> bytes:
    return json.dumps({"kind": "Status", "status": "Failure", "message": message}).encode()


def test_the_status_message_is_in_the_log_line() -> None:
    refused = _error(403, "Forbidden", _status(POLICY))
    assert api_message(refused) == POLICY
    assert describe(refused) == f"403 Forbidden: {POLICY}"
    # The client's own exceptions carry the body as text.
    assert describe(_error(409, "Conflict", _status("x").decode())) == "409 Conflict: x"
    for body in (None, b"", b"<html>bad gateway</html>", b"[1]"):
        assert describe(_error(502, "Bad Gateway", body)) == "502 Bad Gateway"
    assert describe(TimeoutError()) == "TimeoutError()"


def test_a_refusal_is_write_refused_anything_else_api_error() -> None:
    what = "create its VNPUAllocation on node n1"
    reason, message, key = write_failure(what, _error(403, "Forbidden", _status(POLICY)))
    assert reason == names.REASON_WRITE_REFUSED
    assert message == (
        f"the API server refused to create its VNPUAllocation on node n1 (403 Forbidden: "
        f"{POLICY}); retrying"
    )
    assert key == "403"
    for status in (400, 401, 422):
        assert write_failure(what, _error(status, "x", None))[0] == names.REASON_WRITE_REFUSED
    reason, message, key = write_failure(what, _error(503, "Service Unavailable", None))
    assert reason == names.REASON_API_ERROR
    assert message == (
        "the operator could not create its VNPUAllocation on node n1 "
        "(503 Service Unavailable); retrying"
    )
    reason, _, key = write_failure(what, ConnectionRefusedError())
    assert (reason, key) == (names.REASON_API_ERROR, "ConnectionRefusedError")


class RefusingApi(FakeApi):
    """Every allocation create and pin patch is refused as the allocation
    policy refuses an operator it does not know, while `refusing`."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = {"create_allocation"}

    def _record(self, name: str, arg: Any) -> None:
        super()._record(name, arg)
        if name in self.refusing:
            raise _error(403, "Forbidden", _status(POLICY))


async def _retried(w: World, uid: str, times: int) -> None:
    """The pod's key run `times` more times (the queue's backoff is not waited for)."""
    for _ in range(times):
        w.controller.kick(uid)
        await w.settle()


async def test_the_pod_is_told_once_its_writes_keep_failing_and_once_only() -> None:
    w = World(api := RefusingApi())
    w.add_node("n1")
    w.controller.mark_synced()
    w.controller.pod_event("ADDED", pod())
    await w.settle()
    # One failure is often a conflict the next try gets past: nothing said yet.
    assert api.of("set_pod_condition") == []
    await _retried(w, "u1", 3)
    expected = (
        f"the API server refused to create its VNPUAllocation on node n1 (403 Forbidden: "
        f"{POLICY}); retrying"
    )
    assert api.of("set_pod_condition") == [("False", names.REASON_WRITE_REFUSED, expected)]
    assert api.of("event") == [(names.REASON_WRITE_REFUSED, expected)]
    # Fixed: placed, and the condition turns.
    tried = len(w.created())  # every create asked for, the refused ones included
    api.refusing.clear()
    await _retried(w, "u1", 1)
    assert len(w.created()) == tried + 1
    w.echo_created(names.PHASE_READY)
    await w.settle()
    assert api.of("set_pod_condition")[-1][:2] == ("True", names.REASON_ALLOCATED)


async def test_a_refused_pin_patch_is_told_too() -> None:
    w = World(api := RefusingApi())
    api.refusing = {"patch_pod"}
    w.add_node("n1")
    w.controller.mark_synced()
    w.controller.pod_event("ADDED", pod())
    await w.settle()
    w.echo_created(names.PHASE_READY)
    await w.settle()
    await _retried(w, "u1", 2)
    ((status, reason, message),) = api.of("set_pod_condition")
    assert (status, reason) == ("False", names.REASON_WRITE_REFUSED)
    assert message.startswith(
        "the API server refused to pin it to node n1 and remove its scheduling gate (403 "
    )
