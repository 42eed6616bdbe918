"""The webhook server over HTTP: AdmissionReview in, AdmissionReview out."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer

from vnpu_common.wire import names
from vnpu_operator.admission import OfferedTemplates, create_app
from vnpu_operator.admission.decisions import NOT_SYNCED, decide_validation

PodFactory = Callable[..., dict[str, Any]]


class OfferState:
    """What the fake operator inventory answers; tests change it mid-flight."""

    def __init__(self, offered: OfferedTemplates | None) -> None:
        self.offered = offered
        self.fail = False

    def __call__(self) -> OfferedTemplates | None:
        if self.fail:
            raise RuntimeError("inventory broke")
        return self.offered


@pytest.fixture
def state(offered: OfferedTemplates) -> OfferState:
    return OfferState(offered)


@pytest.fixture
async def client(state: OfferState) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(create_app(state))) as test_client:
        yield test_client


def _review(pod: Any, uid: str = "uid-1", operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": operation,
            "object": pod,
        },
    }


async def _post(client: TestClient[Any, Any], path: str, body: Any) -> dict[str, Any]:
    resp = await client.post(path, json=body)
    assert resp.status == 200
    doc: dict[str, Any] = await resp.json()
    assert doc["apiVersion"] == "admission.k8s.io/v1"
    assert doc["kind"] == "AdmissionReview"
    response: dict[str, Any] = doc["response"]
    return response


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


async def test_mutate_returns_patch_that_validate_then_accepts(
    client: TestClient[Any, Any], make_pod: PodFactory
) -> None:
    pod = make_pod(init_containers=["setup"])
    response = await _post(client, names.WEBHOOK_MUTATE_PATH, _review(pod, uid="abc"))
    assert response["uid"] == "abc"
    assert response["allowed"] is True
    patched = jsonpatch.apply_patch(pod, _patch(response))
    assert patched["spec"]["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]

    # The API server validates the mutated pod; unmutated it must be refused.
    response = await _post(client, names.WEBHOOK_VALIDATE_PATH, _review(patched, uid="def"))
    assert response == {"uid": "def", "allowed": True}
    response = await _post(client, names.WEBHOOK_VALIDATE_PATH, _review(pod))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert f"the pod lacks what webhook {names.WEBHOOK_MUTATE_NAME} adds" in message
    assert "/spec/schedulingGates" in message


async def test_mutate_again_after_patch_has_no_patch(
    client: TestClient[Any, Any], make_pod: PodFactory
) -> None:
    pod = make_pod()
    first = await _post(client, names.WEBHOOK_MUTATE_PATH, _review(pod))
    patched = jsonpatch.apply_patch(pod, _patch(first))
    second = await _post(client, names.WEBHOOK_MUTATE_PATH, _review(patched))
    assert second == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize("path", [names.WEBHOOK_MUTATE_PATH, names.WEBHOOK_VALIDATE_PATH])
async def test_bad_pod_is_denied_with_every_problem(
    client: TestClient[Any, Any], make_pod: PodFactory, path: str
) -> None:
    pod = make_pod({names.ANN_COUNT: "9"}, template="vir99")
    response = await _post(client, path, _review(pod))
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == 422
    assert response["status"]["message"].split("\n") == [
        'vnpu.io/count "9" is out of range; expected an integer from 1 to 8',
        'vnpu.io/template "vir99" is not offered by any node; offered: '
        "310P3: vir01, vir02, vir04; 910B3: vir05_1c_16g, vir10_3c_32g",
    ]


@pytest.mark.parametrize("path", [names.WEBHOOK_MUTATE_PATH, names.WEBHOOK_VALIDATE_PATH])
async def test_pod_without_template_passes_unchanged(
    client: TestClient[Any, Any], make_pod: PodFactory, path: str
) -> None:
    response = await _post(client, path, _review(make_pod(template=None)))
    assert response == {"uid": "uid-1", "allowed": True}


async def test_other_operations_and_kinds_pass(
    client: TestClient[Any, Any], make_pod: PodFactory
) -> None:
    bad = make_pod(template="vir99")
    update = _review(bad, operation="UPDATE")
    response = await _post(client, names.WEBHOOK_MUTATE_PATH, update)
    assert response == {"uid": "uid-1", "allowed": True}
    other = _review({"metadata": {}})
    other["request"]["kind"]["kind"] = "ConfigMap"
    assert (await _post(client, names.WEBHOOK_VALIDATE_PATH, other))["allowed"] is True
    delete = _review(None, operation="DELETE")
    assert (await _post(client, names.WEBHOOK_VALIDATE_PATH, delete))["allowed"] is True


async def test_offer_is_read_per_request(
    client: TestClient[Any, Any], state: OfferState, make_pod: PodFactory
) -> None:
    review = _review(make_pod(template="vir02_1c"))
    assert (await _post(client, names.WEBHOOK_MUTATE_PATH, review))["allowed"] is False
    state.offered = OfferedTemplates.of_sizes({"310P3": {"vir02_1c": (2, 6144)}})
    assert (await _post(client, names.WEBHOOK_MUTATE_PATH, review))["allowed"] is True
    state.offered = None  # inventory not synced: no charge can be made, so no admission
    refused = await _post(client, names.WEBHOOK_MUTATE_PATH, review)
    assert refused["allowed"] is False
    assert refused["status"]["message"] == NOT_SYNCED
    state.offered = OfferedTemplates.of_sizes({"310P3": {"vir02_1c": (2, 6144)}})
    state.fail = True  # a broken inventory behaves like an unsynced one
    assert (await _post(client, names.WEBHOOK_MUTATE_PATH, review))["status"]["message"] == (
        NOT_SYNCED
    )


async def test_malformed_pod_shape_is_denied_not_crashed(
    client: TestClient[Any, Any], make_pod: PodFactory
) -> None:
    pod = make_pod(schedulingGates="nope")
    response = await _post(client, names.WEBHOOK_MUTATE_PATH, _review(pod))
    assert response["allowed"] is False
    assert response["status"]["message"] == "spec.schedulingGates is not a list"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        (b"[]", "body is not a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "expected"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}', "expected apiVersion"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request is"),
    ],
)
async def test_malformed_bodies_get_400(
    client: TestClient[Any, Any], body: bytes, message: str
) -> None:
    for path in (names.WEBHOOK_MUTATE_PATH, names.WEBHOOK_VALIDATE_PATH):
        resp = await client.post(path, data=body)
        assert resp.status == 400
        assert message in await resp.text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["request"].pop("uid"), "request.uid is missing"),
        (lambda r: r["request"].update(uid=""), "request.uid is missing"),
        (lambda r: r["request"].update(uid=7), "request.uid is missing"),
        (lambda r: r["request"].pop("kind"), "request.kind is missing"),
        (lambda r: r["request"].pop("operation"), "request.operation is missing"),
        (lambda r: r["request"].update(object="pod"), "request.object of a CREATE is not"),
    ],
)
async def test_malformed_requests_get_400(
    client: TestClient[Any, Any],
    make_pod: PodFactory,
    change: Callable[[dict[str, Any]], object],
    message: str,
) -> None:
    review = _review(make_pod())
    change(review)
    resp = await client.post(names.WEBHOOK_MUTATE_PATH, json=review)
    assert resp.status == 400
    assert message in await resp.text()


async def test_server_survives_garbage_and_keeps_answering(
    client: TestClient[Any, Any], make_pod: PodFactory
) -> None:
    garbage_pods: list[Any] = [
        {},
        {"metadata": {"annotations": {names.ANN_TEMPLATE: None}}},
        {"metadata": {"annotations": {names.ANN_TEMPLATE: "vir01"}}, "spec": []},
        {"metadata": {"annotations": {names.ANN_TEMPLATE: "vir01"}}, "spec": {"nodeName": 3}},
        {
            "metadata": {"annotations": {names.ANN_TEMPLATE: "vir01"}, "finalizers": 1},
            "spec": {"containers": [{"name": "a", "env": [None, 1, {"name": None}]}]},
        },
    ]
    for pod in garbage_pods:
        for path in (names.WEBHOOK_MUTATE_PATH, names.WEBHOOK_VALIDATE_PATH):
            resp = await client.post(path, json=_review(pod))
            assert resp.status == 200, await resp.text()
    resp = await client.get(names.WEBHOOK_HEALTH_PATH)
    assert resp.status == 200
    assert await resp.text() == "ok\n"


async def test_oversized_body_is_refused(client: TestClient[Any, Any]) -> None:
    resp = await client.post(names.WEBHOOK_MUTATE_PATH, data=b" " * (5 * 1024 * 1024))
    assert resp.status == 413


def test_decide_validation_without_http(make_pod: PodFactory, offered: OfferedTemplates) -> None:
    decision = decide_validation(make_pod(nodeName="n1"), offered)
    assert decision.allowed is False
    assert decision.problems[0].startswith("vnpu.io/template cannot be used with spec.nodeName")


async def test_runtime_class_setting_reaches_both_webhooks(
    state: OfferState, make_pod: PodFactory
) -> None:
    async with TestClient(TestServer(create_app(state, runtime_class_name="ascend"))) as client:
        pod = make_pod()
        response = await _post(client, names.WEBHOOK_MUTATE_PATH, _review(pod))
        patched = jsonpatch.apply_patch(pod, _patch(response))
        assert patched["spec"]["runtimeClassName"] == "ascend"
        response = await _post(client, names.WEBHOOK_VALIDATE_PATH, _review(patched))
        assert response["allowed"] is True
        # A later webhook that dropped the class is caught like one that dropped the gate.
        del patched["spec"]["runtimeClassName"]
        response = await _post(client, names.WEBHOOK_VALIDATE_PATH, _review(patched))
        assert response["allowed"] is False
        assert "/spec/runtimeClassName" in response["status"]["message"]


async def test_an_ephemeral_container_of_a_vnpu_pod_gets_no_devices_over_http(
    client: TestClient[Any, Any], make_pod: PodFactory
) -> None:
    """kubectl debug: an UPDATE of pods/ephemeralcontainers reaches the mutating webhook,
    which writes the empty device list into the new container only, and refuses one
    asking the runtime for a vNPU of its own; the validating webhook lets it pass."""
    old = make_pod()
    old["spec"]["ephemeralContainers"] = [{"name": "before", "image": "busybox"}]
    new = json.loads(json.dumps(old))
    new["spec"]["ephemeralContainers"].append({"name": "debug", "image": "busybox"})
    review = _review(new, operation="UPDATE")
    review["request"]["subResource"] = "ephemeralcontainers"
    review["request"]["oldObject"] = old
    response = await _post(client, names.WEBHOOK_MUTATE_PATH, review)
    assert response["allowed"] is True
    patched = jsonpatch.apply_patch(new, _patch(response))
    before, debug = patched["spec"]["ephemeralContainers"]
    assert "env" not in before
    assert {e["name"]: e.get("value") for e in debug["env"]} == {
        names.ENV_VISIBLE_DEVICES: "", names.ENV_RUNTIME_OPTIONS: "VIRTUAL",
        names.ENV_VNPU_SPECS: "",
    }  # fmt: skip
    assert (await _post(client, names.WEBHOOK_VALIDATE_PATH, review))["allowed"] is True

    new["spec"]["ephemeralContainers"][1]["env"] = [{"name": names.ENV_VNPU_SPECS, "value": "x"}]
    response = await _post(client, names.WEBHOOK_MUTATE_PATH, review)
    assert response["allowed"] is False
    assert "ASCEND_VNPU_SPECS: no pod may set it" in response["status"]["message"]
