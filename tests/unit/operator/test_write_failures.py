"""What a pod and the log are told when the operator's writes fail: the API
server's Status message, not its whole body nor only `403 Forbidden`, and
which reason (WriteRefused for a refusal, APIError for the rest)."""

from __future__ import annotations

import json

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common import names
from vnpu_common.rawcall import api_message, describe
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
