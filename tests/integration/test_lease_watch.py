"""The operator's Lease watch against the real API server: every agent Lease
reaches the controller when listed and again when renewed, other Leases do
not, a deleted Lease arrives as DELETED, and a failing API is retried without
ending the loop."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config

from localplane import LocalPlane
from vnpu_common.wire import names
from vnpu_operator.leases import LeaseWatch

pytestmark = pytest.mark.plane


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str | None, str, Any]] = []
        self.changed = asyncio.Event()

    def lease_event(self, event_type: str | None, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        self.events.append((event_type, obj["metadata"]["name"], spec.get("renewTime")))
        self.changed.set()

    async def wait(self, count: int) -> list[tuple[str | None, str, Any]]:
        async with asyncio.timeout(15):
            while len(self.events) < count:
                self.changed.clear()
                await self.changed.wait()
        out = sorted(self.events, key=lambda e: (e[1], e[0] or ""))
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


async def test_agent_leases_are_listed_renewed_and_deleted(
    plane: LocalPlane, namespace: str
) -> None:
    a, b = names.lease_name("watch-a"), names.lease_name("watch-b")
    for name, duration in ((a, 40), (b, 8), ("kube-something-else", 1)):
        plane.kubectl("apply", "-f", "-", input=lease(namespace, name, duration))
    api_client = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    sink = Sink()
    watch = LeaseWatch(client.CoordinationV1Api(api_client), namespace, sink, retry_max=1.0)
    task = asyncio.create_task(watch.run())
    try:
        listed = await sink.wait(2)
        assert [(t, n) for t, n, _ in listed] == [(None, a), (None, b)]  # the foreign one: never
        assert watch.listed.is_set()

        renewed_a = listed[0][2]
        plane.kubectl("apply", "-f", "-", input=lease(namespace, a, 40))
        plane.kubectl("apply", "-f", "-", input=lease(namespace, "kube-something-else", 2))
        ((kind, name, renewed),) = await sink.wait(1)
        assert (kind, name) == ("MODIFIED", a)
        assert renewed != renewed_a  # the renewal's time, as the controller reads it

        plane.kubectl("delete", "lease", "-n", namespace, b)
        assert [(t, n) for t, n, _ in await sink.wait(1)] == [("DELETED", b)]
        await asyncio.sleep(0.5)
        assert sink.events == []  # told once; the foreign Lease's change never
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await api_client.close()


async def test_failing_api_is_retried_and_the_loop_survives() -> None:
    sink = Sink()
    # An API server address where nothing listens: every LIST fails.
    dead = client.Configuration()
    dead.host = "https://127.0.0.1:9"
    dead_client = client.ApiClient(dead)
    watch = LeaseWatch(client.CoordinationV1Api(dead_client), "vnpu-system", sink, retry_max=0.2)
    task = asyncio.create_task(watch.run())
    try:
        async with asyncio.timeout(15):
            while watch.informer.errors < 3:  # noqa: ASYNC110 - counts failures another task makes
                await asyncio.sleep(0.05)
        assert not task.done()
        assert sink.events == []
        assert not watch.listed.is_set()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await dead_client.close()
