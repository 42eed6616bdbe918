"""The DRA pool publisher (vnpu_agent.dra.publisher) against a fake API:
written whole with the next generation when the chips, their health or the
cordons change, never on a vNPU, put back when changed by someone else,
failures retried. On a real API server: tests/integration/test_dra_slices.py."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any, cast

import pytest
from agent_helpers import RecordingApi, allocation
from aiohttp import web
from kubernetes_asyncio import client

from vnpu_agent.config import AgentSettings
from vnpu_agent.dra.publisher import PoolPublisher, ResourceApiMissingError, SliceApi
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.node import NodeAgent
from vnpu_common.wire import names


class FakeSlices:
    """ResourceSlices by name, as an API server keeps them; `drop`: fields
    it drops from what it is sent (a feature gate off); `fail`: writes to
    refuse before one succeeds."""

    def __init__(self, *, drop: tuple[str, ...] = ()) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.drop = drop
        self.fail = 0
        self.rv = 0

    async def node_uid(self, node: str) -> str:
        return f"uid-{node}"

    async def list_pool(self, node: str) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for o in self.objects.values()
            if o["spec"]["pool"]["name"] == node and o["spec"]["driver"] == "vnpu.io"
        ]

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail:
            self.fail -= 1
            raise ConnectionResetError("refused")
        obj = copy.deepcopy(body)
        for field in self.drop:
            obj["spec"].pop(field, None)
        for device in obj["spec"].get("devices", []):
            for taint in device.get("taints", []):
                taint["timeAdded"] = "2026-11-26T17:00:00Z"
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        assert body["metadata"]["name"] not in self.objects
        self.writes.append(("create", body["metadata"]["name"]))
        return self._store(body)

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        assert (
            body["metadata"]["resourceVersion"] == self.objects[name]["metadata"]["resourceVersion"]
        )
        self.writes.append(("replace", name))
        return self._store(body)

    async def delete(self, name: str) -> None:
        self.writes.append(("delete", name))
        self.objects.pop(name, None)

    def generations(self) -> set[int]:
        return {o["spec"]["pool"]["generation"] for o in self.objects.values()}

    def devices(self) -> set[str]:
        return {d["name"] for o in self.objects.values() for d in o["spec"].get("devices", [])}


async def dra_agent(tmp_path: Path, fake: FakeSlices, chips: str = "910B3=2") -> NodeAgent:
    settings = AgentSettings(
        simulate_nodes=["n1"], state_dir=tmp_path / "state", cdi_dir=tmp_path / "cdi",
        inventory_min_interval_seconds=0, inventory_settle_seconds=0, dra=True,
        retry_max_seconds=0.05,
    )  # fmt: skip
    agent = NodeAgent(
        "n1", SimDriver(tmp_path / "sim.json", chips), cast(AgentApi, RecordingApi()),
        settings, AgentMetrics(), synced=lambda: True, slice_api=cast(SliceApi, fake),
    )  # fmt: skip
    await agent.view.refresh()
    return agent


def pool_of(agent: NodeAgent) -> PoolPublisher:
    assert agent.pool is not None
    return agent.pool


async def test_the_pool_is_written_once_with_the_status_saying_dra(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake)
    await agent.publisher.publish()
    assert cast(RecordingApi, agent.api).status["dra"] is True
    await pool_of(agent).sync()
    assert fake.writes == [("create", "n1-vnpu-counters-000"), ("create", "n1-vnpu-devices-000")]
    assert fake.generations() == {1}
    assert pool_of(agent).generation == 1
    for obj in fake.objects.values():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-n1"
    # Nothing changed: the API is read, nothing written.
    await pool_of(agent).sync()
    assert len(fake.writes) == 2


async def test_every_chip_offers_its_models_templates_as_devices(tmp_path: Path) -> None:
    # The status lists each model's templates once (status.models); the pool
    # is built from chips that each carry their model's list.
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake, chips="910B3=1,310P3=1")
    await agent.publisher.publish()
    assert "templates" not in cast(RecordingApi, agent.api).status["chips"][0]
    await pool_of(agent).sync()
    sim = SimDriver(tmp_path / "sim.json")
    devices = fake.objects["n1-vnpu-devices-000"]["spec"]["devices"]
    for chip in sim.list_chips():
        offered = {t.name for t in sim.list_templates(chip.index)}
        listed = {
            parsed[1]
            for d in devices
            if (parsed := names.parse_dra_device_name(d["name"])) and parsed[0] == chip.index
        }
        assert offered, chip.index
        assert listed == offered, chip.index


async def test_a_live_claims_vnpu_changes_no_slice(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake)
    await agent.publisher.publish()
    pool = pool_of(agent)
    await pool.sync()
    pool._wake.clear()
    claim = allocation("a", 100, template="vir10_3c_32g")
    claim["spec"]["claim"] = {"name": "c", "uid": "u", "request": "npu", "device": "d"}
    await agent.on_event("ADDED", claim)
    agent.view.driver.create_vnpu(0, "vir10_3c_32g", 100)
    await agent.view.refresh()
    await agent.publisher.publish()
    assert cast(RecordingApi, agent.api).status["vnpuCount"] == 1
    assert not pool._wake.is_set()


async def test_cordon_and_health_bump_the_generation_of_every_slice(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake)
    pool = pool_of(agent)
    await agent.publisher.publish()
    await pool.sync()
    assert len(fake.devices()) == 12

    pool._wake.clear()
    meta = {"name": "n1", "labels": {names.LABEL_NODE: "n1"}}
    spec = {"cordonedChips": [{"chip": 1, "reason": "fan"}]}
    status = copy.deepcopy(cast(RecordingApi, agent.api).status)
    await agent.on_node_event("MODIFIED", {"metadata": meta, "spec": spec, "status": status})
    await asyncio.sleep(0.1)  # the (zero) coalescing interval and the publish it starts
    assert pool._wake.is_set()
    await pool.sync()
    assert fake.generations() == {2}
    assert fake.writes[2:] == [
        ("replace", "n1-vnpu-counters-000"),
        ("replace", "n1-vnpu-devices-000"),
    ]
    # The cordoned chip offers nothing (no taint a claim could tolerate).
    assert fake.devices()
    assert all(d.startswith("npu-0-") for d in fake.devices())

    cast(SimDriver, agent.view.driver).set_chip_health(0, False)
    await agent.publisher.publish()
    await pool.sync()
    assert fake.generations() == {3}
    # The unhealthy chip offers nothing either; its counters stay. (The fake
    # API's answer carries no spec, so the cordon is not echoed here.)
    assert not any(d.startswith("npu-0-") for d in fake.devices())
    assert len(fake.objects["n1-vnpu-counters-000"]["spec"]["sharedCounters"]) == 2
    writes = len(fake.writes)
    await pool.sync()
    assert len(fake.writes) == writes


async def test_a_slice_changed_or_deleted_by_someone_else_is_put_back(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake, chips="310P3=16")
    pool = pool_of(agent)
    await agent.publisher.publish()
    await pool.sync()
    assert len(fake.objects) == 2 + 7  # 16 x 28 devices: 20 of each chip, 8 in its room
    assert fake.generations() == {1}
    del fake.objects["n1-vnpu-devices-003"]
    fake.objects["n1-vnpu-counters-001"]["spec"]["sharedCounters"].pop()
    # A stray slice of the pool (an older agent's naming) is deleted.
    stray = copy.deepcopy(fake.objects["n1-vnpu-devices-000"])
    stray["metadata"]["name"] = "n1-old"
    fake.objects["n1-old"] = stray
    await pool.sync()
    assert fake.generations() == {2}
    assert len(fake.objects) == 9
    assert ("delete", "n1-old") in fake.writes


async def test_recheck_wakes_the_task_once_the_chips_are_known(tmp_path: Path) -> None:
    agent = await dra_agent(tmp_path, FakeSlices())
    pool = pool_of(agent)
    pool.recheck()
    assert not pool._wake.is_set()
    await agent.publisher.publish()
    pool._wake.clear()
    pool.recheck()
    assert pool._wake.is_set()


async def test_a_pool_already_in_the_api_is_adopted_without_a_write(tmp_path: Path) -> None:
    fake = FakeSlices()
    first = await dra_agent(tmp_path, fake)
    await first.publisher.publish()
    await pool_of(first).sync()
    writes = len(fake.writes)
    # The agent restarts: same chips, same pool.
    again = await dra_agent(tmp_path, fake)
    await again.publisher.publish()
    await pool_of(again).sync()
    assert len(fake.writes) == writes
    assert pool_of(again).generation == 1


async def test_fields_the_server_drops_cause_no_rewrite(tmp_path: Path) -> None:
    """An API server with partitionable devices off (Kubernetes < 1.36)
    drops sharedCounters: the pool is written once, not on every check."""
    fake = FakeSlices(drop=("sharedCounters",))
    agent = await dra_agent(tmp_path, fake)
    await agent.publisher.publish()
    await pool_of(agent).sync()
    writes = len(fake.writes)
    await pool_of(agent).sync()
    assert len(fake.writes) == writes


async def test_fewer_chips_delete_the_surplus_slices(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake, chips="310P3=16")
    pool = pool_of(agent)
    await agent.publisher.publish()
    await pool.sync()
    assert len(fake.objects) == 9
    pool.update(pool._chips[:4] if pool._chips else [], [])
    await pool.sync()
    assert sorted(fake.objects) == [
        "n1-vnpu-counters-000", "n1-vnpu-devices-000", "n1-vnpu-devices-001",
    ]  # fmt: skip
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in fake.objects.values()} == {3}


async def test_failures_are_retried_and_never_end_the_task(tmp_path: Path) -> None:
    fake = FakeSlices()
    fake.fail = 3
    agent = await dra_agent(tmp_path, fake)
    pool = pool_of(agent)
    task = asyncio.create_task(pool.run())
    try:
        await agent.publisher.publish()
        for _ in range(200):
            if fake.generations() == {1} and len(fake.objects) == 2:
                break
            await asyncio.sleep(0.02)
        assert fake.generations() == {1}
        assert len(fake.objects) == 2
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    ("status", "body", "served"),
    [
        (200, {"resources": [{"name": "resourceslices"}, {"name": "deviceclasses"}]}, True),
        (200, {"resources": [{"name": "deviceclasses"}]}, False),
        (404, {"kind": "Status", "code": 404}, False),
    ],
)
async def test_dra_needs_resource_k8s_io_v1(
    status: int, body: dict[str, Any], served: bool
) -> None:
    """--dra on an API server without resource.k8s.io/v1 (Kubernetes < 1.34)
    is an error at start that says what to do."""
    seen: list[str] = []

    async def group(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/", group)
    app.router.add_get("/apis/resource.k8s.io/v1", group)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        api = SliceApi(api_client, AgentMetrics().api_errors)
        if served:
            await api.check_served()
        else:
            with pytest.raises(ResourceApiMissingError, match=r"--dra needs .* agent.dra=false"):
                await api.check_served()
        assert seen
    finally:
        await api_client.close()
        await runner.cleanup()
