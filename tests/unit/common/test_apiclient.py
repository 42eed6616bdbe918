"""The components' API client looks the environment up once, not per request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes_asyncio import client

from vnpu_common.kube.apiclient import CONNECTIONS, api_client


@pytest.fixture
def server() -> Iterator[None]:
    old = client.Configuration.get_default_copy()
    conf = client.Configuration(host="https://api.cluster.example:6443")
    client.Configuration.set_default(conf)
    yield
    client.Configuration.set_default(old)


async def test_no_environment_lookup_per_request_and_no_proxy_when_none_is_set(
    server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    api = api_client("vnpu-test/1")
    try:
        assert api.user_agent == "vnpu-test/1"
        assert api.rest_client.pool_manager.trust_env is False
        assert not api.rest_client.proxy
    finally:
        await api.close()


async def test_a_proxy_the_environment_names_for_the_api_server_is_kept(
    server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    api = api_client("vnpu-test/1")
    try:
        assert api.rest_client.proxy == "http://proxy.example:3128"
        assert api.rest_client.proxy_headers["Proxy-Authorization"].startswith("Basic ")
    finally:
        await api.close()


async def test_no_proxy_exempts_the_api_server(
    server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", ".cluster.example")
    api = api_client("vnpu-test/1")
    try:
        assert not api.rest_client.proxy
    finally:
        await api.close()


async def test_connections_are_capped(server: None) -> None:
    # A burst of writes (a release of 100 pods) queues behind the cap: 32 held
    # the waiting pods' creates seconds behind the release's deletes.
    api = api_client("vnpu-test/1")
    few = api_client("vnpu-test/1", connections=4)
    try:
        ours, capped = (
            api.rest_client.pool_manager.connector,
            few.rest_client.pool_manager.connector,
        )
        assert ours is not None
        assert capped is not None
        assert ours.limit == CONNECTIONS >= 100
        assert capped.limit == 4
        # The default configuration is left as it was.
        assert client.Configuration.get_default_copy().connection_pool_maxsize == 100
    finally:
        await api.close()
        await few.close()


async def test_a_given_configuration_wins_over_the_default_and_is_copied(server: None) -> None:
    """The leader-election thread's client: the main client's credentials,
    whatever the default configuration says by the time the thread starts."""
    own = client.Configuration(host="https://own.example:6443", api_key={"BearerToken": "sa"})
    api = api_client("vnpu-test/1", connections=2, configuration=own)
    try:
        assert api.configuration.host == "https://own.example:6443"
        assert api.configuration.api_key == {"BearerToken": "sa"}
        assert api.configuration is not own
    finally:
        await api.close()
