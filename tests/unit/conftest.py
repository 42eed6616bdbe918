"""Fixtures every unit test folder may use."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused for real."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
async def unreachable_client(closed_port: int) -> AsyncIterator[client.ApiClient]:
    """An API client whose server refuses every connection."""
    api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{closed_port}"))
    try:
        yield api_client
    finally:
        await api_client.close()
