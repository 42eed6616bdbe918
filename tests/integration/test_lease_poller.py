"""The operator's Lease poller against the real API server: every agent Lease
reaches the controller, other Leases do not, a deleted Lease arrives as
DELETED, the interval follows the shortest Lease, and a failing LIST is
retried without ending the loop."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config

from localplane import LocalPlane
from vnpu_common import names
from vnpu_operator.leases import LeasePoller

pytestmark = pytest.mark.plane


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str | None, str, Any]] = []

    def lease_event(self, event_type: str | None, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        self.events.append((event_type, obj["metadata"]["name"], spec.get("renewTime")))

    def take(self) -> list[tuple[str | None, str]]:
        out = sorted(((t, n) for t, n, _ in self.events), key=lambda e: (e[1], e[0] or ""))
        self.events.clear()
        return out


def lease(namespace: str, name: str, duration: int) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return yaml.safe_dump(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": duration, "renewTime": now},
        }
    )


async def test_poll_feeds_agent_leases_and_deletions(plane: LocalPlane, namespace: str) -> None:
    a, b = names.lease_name("poll-a"), names.lease_name("poll-b")
    for name, duration in ((a, 40), (b, 8), ("kube-something-else", 1)):
        plane.kubectl("apply", "-f", "-", input=lease(namespace, name, duration))
    api_client = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    try:
        sink = Sink()
        poller = LeasePoller(
            client.CoordinationV1Api(api_client), namespace, sink, interval=5.0, retry_max=1.0
        )
        assert poller.interval == 5.0  # nothing read yet
        await poller.poll()
        assert sink.take() == [(None, a), (None, b)]
        assert poller.listed.is_set()
        # A quarter of the shortest agent Lease (8 s); the foreign 1 s one is ignored.
        assert poller.interval == 2.0

        plane.kubectl("delete", "lease", "-n", namespace, b)
        await poller.poll()
        assert sink.take() == [(None, a), ("DELETED", b)]
        assert poller.interval == 5.0  # only the 40 s Lease is left: capped by the setting
        await poller.poll()
        assert sink.take() == [(None, a)]  # told once that b is gone
    finally:
        await api_client.close()


async def test_failing_list_is_retried_and_the_loop_survives(
    plane: LocalPlane, namespace: str
) -> None:
    name = names.lease_name("poll-c")
    plane.kubectl("apply", "-f", "-", input=lease(namespace, name, 4))
    api_client = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    try:
        sink = Sink()
        # An API server address where nothing listens: every LIST fails.
        dead = client.Configuration()
        dead.host = "https://127.0.0.1:9"
        dead_client = client.ApiClient(dead)
        poller = LeasePoller(client.CoordinationV1Api(dead_client), namespace, sink, retry_max=0.2)
        task = asyncio.create_task(poller.run())
        async with asyncio.timeout(10):
            while poller.errors < 3:  # noqa: ASYNC110 - counts failures another task makes
                await asyncio.sleep(0.05)
        assert not task.done()
        assert sink.events == []
        assert not poller.listed.is_set()

        # The same loop, once the server is reachable, recovers.
        poller.api = client.CoordinationV1Api(api_client)
        await dead_client.close()
        async with asyncio.timeout(10):
            await poller.listed.wait()
        assert sink.take() == [(None, name)]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await api_client.close()
