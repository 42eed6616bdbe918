"""How the operator writes its webhook configurations (admission/server.py,
_put): it reads first and patches the chart's copy, so it needs no create; one
missing that it may not create is an ERROR line, never a crash."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube import certs
from vnpu_common.wire import names
from vnpu_operator.admission.configurations import mutating_webhook_configuration
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.admission.server import WebhookServer
from vnpu_operator.config import parse_args

CA_PEM = certs.make_ca().cert_pem


class Store:
    """One configuration as the API server keeps it, for a caller that may `create`
    or not (RBAC)."""

    def __init__(self, obj: dict[str, Any] | None, *, may_create: bool) -> None:
        self.obj = obj
        self.may_create = may_create
        self.calls: list[str] = []

    async def read(self, name: str) -> dict[str, Any]:
        self.calls.append("read")
        if self.obj is None:
            raise ApiException(status=404, reason="Not Found")
        return self.obj

    async def create(self, body: dict[str, Any]) -> None:
        self.calls.append("create")
        if not self.may_create:
            raise ApiException(status=403, reason="Forbidden")
        self.obj = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def patch(self, name: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append("patch")
        assert self.obj is not None
        self.obj = {**self.obj, **body}


@pytest.fixture
async def server() -> AsyncIterator[WebhookServer]:
    ws = WebhookServer(parse_args([]), lambda: None, QuotaBook())
    # Only for sanitize_for_serialization: it calls nothing.
    api = ws._api_client = client.ApiClient()
    yield ws
    await api.close()


def body() -> dict[str, Any]:
    return mutating_webhook_configuration("https://127.0.0.1:9443", CA_PEM)


async def test_the_charts_configuration_is_read_and_patched_never_created(
    server: WebhookServer,
) -> None:
    shipped = {**body(), "metadata": {"name": names.WEBHOOK_CONFIG_NAME, "resourceVersion": "7"}}
    store = Store(shipped, may_create=False)
    assert await server._put(body(), store.create, store.read, store.patch)
    assert store.calls == ["read", "patch"]


async def test_without_the_chart_the_operator_creates_it(server: WebhookServer) -> None:
    store = Store(None, may_create=True)
    assert await server._put(body(), store.create, store.read, store.patch)
    assert store.calls == ["read", "create"]
    assert store.obj is not None


async def test_a_deleted_configuration_it_may_not_create_is_an_error_line(
    server: WebhookServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(None, may_create=False)
    with caplog.at_level(logging.ERROR, logger="vnpu_operator.admission.server"):
        assert not await server._put(body(), store.create, store.read, store.patch)
    assert store.calls == ["read", "create"]
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"MutatingWebhookConfiguration {names.WEBHOOK_CONFIG_NAME} does not exist and this "
        "operator may not create it"
    )
