"""The pool put back within seconds when someone else deletes or changes it
(issue 54, item 9: the kubelet wipes a node's slices at its start and 30 s
after a plugin left), from the watch of the pool's slices, with no write
when nothing differs and a growing delay when someone keeps changing it;
every slice written counted in vnpu_agent_dra_pool_writes_total; a node
leaving DRA deletes its pool. vnpu_agent.dra.publisher against a fake API.
On a real API server: tests/integration/test_dra_slices.py."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from test_dra_pool import FakeSlices, dra_agent, pool_of

from vnpu_agent.dra.publisher import PoolPublisher, SliceApi, SliceWatcher, delete_pools
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.node import NodeAgent
from vnpu_common.kube.backoff import Backoff


async def published(tmp_path: Path, fake: FakeSlices) -> tuple[NodeAgent, PoolPublisher]:
    """An agent whose pool is written, its `run` task going and the watch's
    echoes of that write delivered."""
    agent = await dra_agent(tmp_path, fake)
    pool = pool_of(agent)
    await agent.publisher.publish()
    await pool.sync()
    for obj in fake.objects.values():
        await pool.on_slice_event("ADDED", copy.deepcopy(obj))
    return agent, pool


async def until(what: str, check: Any, within: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_wiped_pool_is_back_within_a_second_from_the_watch(
    tmp_path: Path, running: list[asyncio.Task[None]]
) -> None:
    """Fails before issue 54: only the periodic read (300 s) put it back."""
    fake = FakeSlices()
    _agent, pool = await published(tmp_path, fake)
    assert pool.verify_seconds == 300
    running.append(asyncio.create_task(pool.run()))
    await asyncio.sleep(0.05)
    writes = len(fake.writes)
    # The kubelet deletes the node's slices.
    for name in list(fake.objects):
        gone = fake.objects.pop(name)
        await pool.on_slice_event("DELETED", gone)
    start = asyncio.get_running_loop().time()
    await until("the pool back", lambda: len(fake.objects) == 2)
    assert asyncio.get_running_loop().time() - start < 1.5
    assert fake.writes[writes:] == [
        ("create", "n1-vnpu-counters-000"),
        ("create", "n1-vnpu-devices-000"),
    ]
    # Above the wiped pool's: a consumer still showing the old slices sees these as newer.
    assert fake.generations() == {2}
    assert pool.repairs == 1


async def test_our_own_echoes_and_unrelated_edits_write_nothing(
    tmp_path: Path, running: list[asyncio.Task[None]]
) -> None:
    fake = FakeSlices()
    _agent, pool = await published(tmp_path, fake)
    running.append(asyncio.create_task(pool.run()))
    writes = len(fake.writes)
    # The echoes again (a relist), and a label someone adds: nothing we decide.
    for obj in fake.objects.values():
        await pool.on_slice_event("SYNC", copy.deepcopy(obj))
    labelled = copy.deepcopy(fake.objects["n1-vnpu-devices-000"])
    labelled["metadata"]["labels"] = {"team": "x"}
    labelled["metadata"]["resourceVersion"] = "999"
    fake.objects["n1-vnpu-devices-000"] = labelled
    await pool.on_slice_event("MODIFIED", copy.deepcopy(labelled))
    await asyncio.sleep(1.0)
    assert len(fake.writes) == writes
    assert pool.repairs == 0


async def test_someone_who_keeps_changing_the_pool_gets_a_growing_delay(
    tmp_path: Path, running: list[asyncio.Task[None]]
) -> None:
    fake = FakeSlices()
    _agent, pool = await published(tmp_path, fake)
    pool._backoff = Backoff(base=1.0, cap=30.0, jitter=0)
    running.append(asyncio.create_task(pool.run()))
    await asyncio.sleep(0.05)

    async def tamper() -> None:
        obj = fake.objects["n1-vnpu-counters-000"]
        obj["spec"]["sharedCounters"][0]["counters"]["aicore"] = {"value": "99"}
        fake.rv += 1
        obj["metadata"]["resourceVersion"] = str(fake.rv)
        await pool.on_slice_event("MODIFIED", copy.deepcopy(obj))

    await tamper()
    await until("first repair", lambda: fake.generations() == {2})
    # The repair's echoes, then the same edit at once: not repaired at once.
    for obj in fake.objects.values():
        await pool.on_slice_event("MODIFIED", copy.deepcopy(obj))
    await tamper()
    await asyncio.sleep(1.2)  # the settle (0.5 s) and less than the second delay (1 s) after it
    assert fake.generations() == {2}
    await until("second repair", lambda: fake.generations() == {3})
    assert pool.repairs == 2


async def test_every_slice_written_is_counted_by_operation(tmp_path: Path) -> None:
    """Fails before issue 54: there was no such metric."""
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake, chips="310P3=16")
    pool = pool_of(agent)
    await agent.publisher.publish()
    await pool.sync()
    pool.update(pool.chips[:4] if pool.chips else [], [])
    await pool.sync()
    registry = agent.metrics.registry

    def count(op: str) -> float | None:
        return registry.get_sample_value("vnpu_agent_dra_pool_writes_total", {"op": op})

    assert (count("create"), count("update"), count("delete")) == (9, 3, 6)


async def test_the_watch_hands_each_slice_to_its_nodes_pool_only(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    class Pool:
        def __init__(self, node: str) -> None:
            self.node = node

        async def on_slice_event(self, kind: str, obj: dict[str, Any]) -> None:
            seen.append((self.node, kind))

    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))
    api = SliceApi(api_client, AgentMetrics().api_errors)
    pools: Any = {"a": Pool("a"), "b": Pool("b")}
    watcher = SliceWatcher(api, pools)

    def sl(pool: str, driver: str = "vnpu.io") -> dict[str, Any]:
        return {
            "metadata": {"name": f"{pool}-x"},
            "spec": {"driver": driver, "pool": {"name": pool}},
        }

    assert watcher._keep(sl("a")) is not None
    assert watcher._keep(sl("c")) is None
    assert watcher._keep(sl("a", "other.example.com")) is None
    await watcher._dispatch("ADDED", sl("b"))
    await watcher._dispatch("ADDED", sl("c"))
    assert seen == [("b", "ADDED")]
    await api_client.close()


@pytest.mark.parametrize(("status", "expected"), [(200, 2), (403, 0), (404, 0)])
async def test_a_node_leaving_dra_deletes_its_pool(status: int, expected: int) -> None:
    """Fails before issue 54: nothing removed the pool of a node whose agent
    runs without --dra, so the scheduler kept allocating from it."""
    deleted: list[str] = []
    selectors: list[str] = []

    def sl(name: str, node: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {"driver": "vnpu.io", "nodeName": node, "pool": {"name": node}},
        }

    async def listing(request: web.Request) -> web.Response:
        selectors.append(request.query.get("fieldSelector", ""))
        if status != 200:
            return web.json_response({"kind": "Status", "code": status}, status=status)
        items = [
            sl("n1-vnpu-counters-000", "n1"),
            sl("n1-vnpu-devices-000", "n1"),
            sl("n2-x", "n2"),
        ]
        return web.json_response({"items": items, "metadata": {}})

    async def delete(request: web.Request) -> web.Response:
        deleted.append(request.match_info["name"])
        return web.json_response({"kind": "Status", "status": "Success"})

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", listing)
    app.router.add_delete("/apis/resource.k8s.io/v1/resourceslices/{name}", delete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    ops: list[str] = []
    try:
        api = SliceApi(api_client, AgentMetrics().api_errors)
        assert await delete_pools(api, ["n1"], written=ops.append) == expected
        assert selectors == ["spec.driver=vnpu.io,spec.nodeName=n1"]
        assert deleted == (["n1-vnpu-counters-000", "n1-vnpu-devices-000"] if expected else [])
        assert ops == ["delete"] * expected
    finally:
        await api_client.close()
        await runner.cleanup()
