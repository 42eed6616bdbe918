"""The DRA kubelet plugin (vnpu_agent/dra/plugin.py, prepare.py) over a real
grpc.aio server on unix sockets, called by a gRPC client acting as the
kubelet; the ResourceClaim and VNPUAllocation reads are a fake fed plain
dicts. Also: the allocation server defers a claim's vNPU destroy while the
claim is prepared (vnpu_agent.serving)."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_helpers import allocation

from vnpu_agent.dra.plugin import KubeletPlugin, Sockets, sockets
from vnpu_agent.dra.prepare import ClaimId, Preparer
from vnpu_agent.dra.protos.dra.v1 import api_pb2 as dra_pb2
from vnpu_agent.dra.protos.dra.v1 import api_pb2_grpc as dra_grpc
from vnpu_agent.dra.protos.pluginregistration.v1 import api_pb2 as reg_pb2
from vnpu_agent.dra.protos.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vnpu_agent.node import NodeAgent
from vnpu_common.kube.workqueue import RetryLater
from vnpu_common.wire import names

NODE = "n1"
NS = "team-a"
UID = "0b5c4a52-6d1e-4b5e-9d59-1f0c6ad0e001"
DEVICE = "npu-0-vir05-1c-16g-0"


def claim_obj(name: str = "c", uid: str = UID, devices: list[str] | None = None) -> dict[str, Any]:
    """An allocated ResourceClaim with one result per device of our pool,
    and one of another driver the plugin must leave alone."""
    results = [
        {"request": "npu", "driver": names.DRA_DRIVER, "pool": NODE, "device": d}
        for d in (devices if devices is not None else [DEVICE])
    ]
    results.append({"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth1"})
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def dra_alloc(
    uid: str = UID, device: str = DEVICE, vnpu_id: int = 100, phase: str | None = "Ready"
) -> dict[str, Any]:
    name = names.dra_allocation_name(uid, device)
    obj = allocation(name, vnpu_id)
    obj["spec"]["claim"] = {"name": "c", "uid": uid, "request": "npu", "device": device}
    obj["metadata"]["labels"][names.LABEL_CLAIM_UID] = uid
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


class Reader:
    """ClaimReader on dicts; counts reads, and can hold them at a gate."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.allocs: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.gate: asyncio.Event | None = None
        self.inside = 0
        self.most_inside = 0

    def add(self, claim: dict[str, Any], *allocs: dict[str, Any]) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim
        for a in allocs:
            self.allocs[(a["metadata"]["namespace"], a["metadata"]["name"])] = a

    async def _read(self, table: dict[tuple[str, str], dict[str, Any]], ns: str, name: str) -> Any:
        self.reads += 1
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            if self.gate is not None:
                await self.gate.wait()
            return copy.deepcopy(table.get((ns, name)))
        finally:
            self.inside -= 1

    async def resource_claim(self, namespace: str, name: str) -> Any:
        return await self._read(self.claims, namespace, name)

    async def allocation(self, namespace: str, name: str) -> Any:
        return await self._read(self.allocs, namespace, name)


class Plugin:
    """A plugin serving on short socket paths, and the kubelet's stubs."""

    def __init__(self, root: Path, state: Path, reader: Reader, pod_uid: str = "pod-1") -> None:
        self.root = root
        self.cdi_dir = state / "cdi"
        self.checkpoint = state / "n1" / "dra" / "checkpoint.json"
        self.reader = reader
        self.paths: Sockets = sockets(
            names.DRA_DRIVER, root / "plugins", root / "plugins_registry", pod_uid
        )
        self.preparer = Preparer(NODE, reader, self.checkpoint, self.cdi_dir, Path("/dev"))
        self.registrations = 0
        self.plugin = KubeletPlugin(
            names.DRA_DRIVER, self.preparer, self.paths, registered=self._registered
        )
        self.channels: list[grpc.aio.Channel] = []

    def _registered(self) -> None:
        self.registrations += 1

    async def start(self) -> None:
        await self.plugin.start()

    async def stop(self) -> None:
        for ch in self.channels:
            await ch.close()
        await self.plugin.stop(grace=0)

    def _channel(self, path: Path) -> grpc.aio.Channel:
        ch = grpc.aio.insecure_channel(f"unix://{path}")
        self.channels.append(ch)
        return ch

    def registration(self) -> Any:
        return reg_grpc.RegistrationStub(self._channel(self.paths.registration))

    def dra(self) -> Any:
        return dra_grpc.DRAPluginStub(self._channel(self.paths.dra))

    async def prepare(self, *claims: tuple[str, str]) -> Any:
        req = dra_pb2.NodePrepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=NS, name=n, uid=u) for n, u in claims]
        )
        return await self.dra().NodePrepareResources(req, timeout=45)

    async def unprepare(self, *claims: tuple[str, str]) -> Any:
        req = dra_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=NS, name=n, uid=u) for n, u in claims]
        )
        return await self.dra().NodeUnprepareResources(req, timeout=45)


@pytest.fixture
def sock_root() -> Any:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path is too long.
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


NewPlugin = Callable[..., Awaitable[Plugin]]


@pytest.fixture
async def new_plugin(sock_root: Path, tmp_path: Path) -> AsyncIterator[NewPlugin]:
    started: list[Plugin] = []

    async def make(reader: Reader | None = None, pod_uid: str = "pod-1") -> Plugin:
        p = Plugin(sock_root, tmp_path, reader or Reader(), pod_uid)
        await p.start()
        started.append(p)
        return p

    yield make
    for p in started:
        await p.stop()


def spec_file(p: Plugin, uid: str = UID, device: str = DEVICE) -> Path:
    return p.cdi_dir / f"vnpu.io-claim-{uid}-{device}.json"


# -- registration -------------------------------------------------------------


async def test_registration_get_info_names_the_dra_socket(new_plugin: NewPlugin) -> None:
    p = await new_plugin(pod_uid="7f0e")
    assert p.paths.registration.name == "vnpu.io-7f0e-reg.sock"
    assert p.paths.dra == p.root / "plugins" / "vnpu.io" / "dra-7f0e.sock"
    info = await p.registration().GetInfo(reg_pb2.InfoRequest(), timeout=5)
    assert info.type == "DRAPlugin"
    assert info.name == names.DRA_DRIVER
    assert info.endpoint == str(p.paths.dra)
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    ack = await p.registration().NotifyRegistrationStatus(
        reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5
    )
    assert isinstance(ack, reg_pb2.RegistrationStatusResponse)
    # Accepted: the pool is read back (the kubelet deleted it while unregistered).
    assert p.registrations == 1
    await p.registration().NotifyRegistrationStatus(
        reg_pb2.RegistrationStatus(plugin_registered=False, error="version"), timeout=5
    )
    assert p.registrations == 1


async def test_without_a_pod_uid_the_sockets_have_the_plain_names(sock_root: Path) -> None:
    s = sockets(names.DRA_DRIVER, sock_root / "p", sock_root / "r")
    assert s.dra == sock_root / "p" / "vnpu.io" / "dra.sock"
    assert s.registration == sock_root / "r" / "vnpu.io-reg.sock"


async def test_stale_sockets_are_removed_live_ones_kept(
    sock_root: Path, tmp_path: Path, new_plugin: NewPlugin
) -> None:
    # An earlier agent's sockets nobody listens on (a crash), and a live one
    # of another agent (a rolling update's old pod).
    old = Plugin(sock_root, tmp_path / "old", Reader(), pod_uid="old")
    await old.start()
    dead = sockets(names.DRA_DRIVER, sock_root / "plugins", sock_root / "plugins_registry", "gone")
    dead.dra.write_text("")
    dead.registration.write_text("")
    mine = sockets(names.DRA_DRIVER, sock_root / "plugins", sock_root / "plugins_registry", "new")
    mine.dra.write_text("")  # our own name, left by our previous run
    try:
        p = await new_plugin(pod_uid="new")
        assert not dead.dra.exists()
        assert not dead.registration.exists()
        assert old.paths.dra.exists()
        assert old.paths.registration.exists()
        info = await p.registration().GetInfo(reg_pb2.InfoRequest(), timeout=5)
        assert info.endpoint == str(mine.dra)
    finally:
        await old.stop()
    assert not old.paths.registration.exists()  # stop removes its own


# -- prepare ------------------------------------------------------------------


async def test_prepare_writes_the_cdi_spec_and_is_idempotent(new_plugin: NewPlugin) -> None:
    reader = Reader()
    reader.add(claim_obj(), dra_alloc(vnpu_id=101))
    p = await new_plugin(reader)
    first = await p.prepare(("c", UID))
    entry = first.claims[UID]
    assert entry.error == ""
    (dev,) = entry.devices
    cdi_id = f"vnpu.io/claim={UID}-{DEVICE}"
    assert list(dev.request_names) == ["npu"]
    assert (dev.pool_name, dev.device_name) == (NODE, DEVICE)
    assert list(dev.cdi_device_ids) == [cdi_id]

    spec = json.loads(spec_file(p).read_text())
    assert spec["kind"] == "vnpu.io/claim"
    (device,) = spec["devices"]
    assert device["name"] == f"{UID}-{DEVICE}"
    nodes = device["containerEdits"]["deviceNodes"]
    assert nodes[0] == {"path": "/dev/davinci101", "hostPath": "/dev/vdavinci101"}
    assert {n["path"] for n in nodes[1:]} == {
        "/dev/davinci_manager",
        "/dev/devmm_svm",
        "/dev/hisi_hdc",
    }
    assert "ASCEND_VISIBLE_DEVICES=101" in device["containerEdits"]["env"]
    assert p.preparer.is_prepared(UID)

    # Retried (the kubelet's timeout, its restart): the same answer, from the
    # checkpoint, the spec put back if it went.
    reads = reader.reads
    spec_file(p).unlink()
    again = await p.prepare(("c", UID))
    assert again == first
    assert reader.reads == reads
    assert spec_file(p).exists()


async def test_unprepare_removes_the_specs_and_is_idempotent(new_plugin: NewPlugin) -> None:
    reader = Reader()
    devices = [DEVICE, "npu-1-vir05-1c-16g-0"]
    reader.add(claim_obj(devices=devices), dra_alloc(), dra_alloc(device=devices[1], vnpu_id=164))
    p = await new_plugin(reader)
    heard: list[str] = []
    p.preparer.on_unprepared(heard.append)
    prepared = await p.prepare(("c", UID))
    assert [d.device_name for d in prepared.claims[UID].devices] == devices
    assert all(spec_file(p, device=d).exists() for d in devices)
    for _ in range(2):
        answer = await p.unprepare(("c", UID))
        assert set(answer.claims) == {UID}
        assert answer.claims[UID].error == ""
    assert not any(spec_file(p, device=d).exists() for d in devices)
    assert not p.preparer.is_prepared(UID)
    assert heard == [UID]  # once: the second had nothing to undo
    assert json.loads(p.checkpoint.read_text())["claims"] == {}


async def test_a_claim_whose_uid_differs_is_refused(new_plugin: NewPlugin) -> None:
    reader = Reader()
    reader.add(claim_obj(uid="another-uid"), dra_alloc(uid="another-uid"))
    p = await new_plugin(reader)
    answer = await p.prepare(("c", UID))
    assert "has UID another-uid, not " + UID in answer.claims[UID].error
    assert not spec_file(p).exists()
    assert not p.preparer.is_prepared(UID)


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (None, f"ResourceClaim {NS}/c not found"),
        ({"status": {}}, "is not allocated"),
    ],
)
async def test_a_missing_or_unallocated_claim_is_refused(
    new_plugin: NewPlugin, claim: dict[str, Any] | None, message: str
) -> None:
    reader = Reader()
    if claim is not None:
        obj = claim_obj()
        obj["status"] = claim["status"]
        reader.add(obj)
    p = await new_plugin(reader)
    answer = await p.prepare(("c", UID))
    assert message in answer.claims[UID].error
    assert not answer.claims[UID].devices


async def test_a_device_whose_vnpu_is_not_ready_is_refused_with_the_reason(
    new_plugin: NewPlugin,
) -> None:
    reader = Reader()
    pending = dra_alloc(phase=None)
    failed = dra_alloc(device="npu-1-vir05-1c-16g-0", vnpu_id=164, phase="Failed")
    failed["status"]["message"] = "creating vNPU 164 failed: chip 1 is full"
    reader.add(claim_obj(devices=[DEVICE, "npu-1-vir05-1c-16g-0", "npu-2-vir05-1c-16g-0"]))
    reader.add(claim_obj(name="d", uid="uid-d"), {**dra_alloc(uid="uid-d"), "spec": {
        **dra_alloc(uid="uid-d")["spec"], "nodeName": "n2"}})  # fmt: skip
    reader.allocs[(NS, pending["metadata"]["name"])] = pending
    reader.allocs[(NS, failed["metadata"]["name"])] = failed
    p = await new_plugin(reader)
    answer = await p.prepare(("c", UID), ("d", "uid-d"))
    error = answer.claims[UID].error
    name = names.dra_allocation_name
    assert f"VNPUAllocation {NS}/{name(UID, DEVICE)} is Pending, not Ready" in error
    assert "is Failed, not Ready: creating vNPU 164 failed: chip 1 is full" in error
    assert "npu-2-vir05-1c-16g-0" in error
    assert "not found (the operator has not" in error
    assert "is for node n2, not n1" in answer.claims["uid-d"].error
    # Nothing prepared, nothing written: a refused Prepare never creates anything.
    assert not p.cdi_dir.exists() or not list(p.cdi_dir.iterdir())
    assert not p.preparer.is_prepared(UID)

    # Once the agent has made the vNPUs, the kubelet's retry succeeds.
    for a in reader.allocs.values():
        a["status"] = {"phase": "Ready"}
    extra = dra_alloc(device="npu-2-vir05-1c-16g-0", vnpu_id=102)
    reader.allocs[(NS, extra["metadata"]["name"])] = extra
    answer = await p.prepare(("c", UID))
    assert len(answer.claims[UID].devices) == 3


async def test_every_claim_of_a_call_gets_an_entry(new_plugin: NewPlugin) -> None:
    reader = Reader()
    reader.add(claim_obj(), dra_alloc())
    p = await new_plugin(reader)
    answer = await p.prepare(("c", UID), ("gone", "uid-gone"))
    assert set(answer.claims) == {UID, "uid-gone"}
    assert answer.claims[UID].error == ""
    assert answer.claims[UID].devices
    assert "not found" in answer.claims["uid-gone"].error
    answer = await p.unprepare(("c", UID), ("gone", "uid-gone"))
    assert set(answer.claims) == {UID, "uid-gone"}


async def test_the_checkpoint_survives_a_restart(
    sock_root: Path, tmp_path: Path, new_plugin: NewPlugin
) -> None:
    reader = Reader()
    reader.add(claim_obj(), dra_alloc())
    first = Plugin(sock_root, tmp_path, reader)
    await first.start()
    await first.prepare(("c", UID))
    await first.stop()

    # A new agent process, the API server out of reach: it still knows the
    # claim is prepared (so the vNPU stays), and Unprepare removes its spec.
    second = await new_plugin(Reader())
    assert second.preparer.is_prepared(UID)
    again = await second.prepare(("c", UID))
    assert again.claims[UID].devices[0].device_name == DEVICE
    await second.unprepare(("c", UID))
    assert not spec_file(second).exists()
    assert not Preparer(NODE, Reader(), second.checkpoint, second.cdi_dir).is_prepared(UID)


async def test_concurrent_calls_are_serialized(new_plugin: NewPlugin) -> None:
    reader = Reader()
    reader.add(claim_obj(), dra_alloc())
    reader.add(claim_obj(name="d", uid="uid-d", devices=["npu-1-vir05-1c-16g-0"]),
               dra_alloc(uid="uid-d", device="npu-1-vir05-1c-16g-0", vnpu_id=164))  # fmt: skip
    reader.gate = asyncio.Event()
    p = await new_plugin(reader)
    calls = [
        asyncio.create_task(p.prepare(("c", UID))),
        asyncio.create_task(p.prepare(("d", "uid-d"))),
        asyncio.create_task(p.unprepare(("c", UID))),
    ]
    await asyncio.sleep(0.3)
    assert reader.inside == 1  # one call in, the others wait for the lock
    reader.gate.set()
    prepared_c, prepared_d, _ = await asyncio.gather(*calls)
    assert reader.most_inside == 1
    assert prepared_c.claims[UID].devices
    assert prepared_d.claims["uid-d"].devices


async def test_a_call_is_bounded(sock_root: Path, tmp_path: Path) -> None:
    reader = Reader()
    reader.add(claim_obj(), dra_alloc())
    reader.gate = asyncio.Event()  # an API server that never answers
    p = Plugin(sock_root, tmp_path, reader)
    p.preparer.budget = 0.3
    await p.start()
    try:
        answer = await p.prepare(("c", UID))
        assert "not prepared within" in answer.claims[UID].error
        assert not p.preparer.is_prepared(UID)
    finally:
        await p.stop()


# -- the allocation server defers the destroy --------------------------------

NewAgent = Callable[..., Awaitable[NodeAgent]]


class Api:
    def __init__(self) -> None:
        self.status: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.finalizers_removed: list[str] = []

    async def patch_allocation_status(self, obj: dict[str, Any], status: dict[str, Any]) -> str:
        self.status[obj["metadata"]["name"]] = copy.deepcopy(status)
        return "2"

    async def remove_finalizer(self, obj: dict[str, Any]) -> None:
        self.finalizers_removed.append(obj["metadata"]["name"])

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": node, "labels": {names.LABEL_NODE: node}}, "status": status}

    async def event(self, involved: dict[str, Any], *, reason: str, message: str, **_: Any) -> None:
        self.events.append((involved["metadata"]["name"], reason, message))


async def test_a_prepared_claims_vnpu_is_destroyed_only_after_unprepare(
    new_agent: NewAgent, new_plugin: NewPlugin
) -> None:
    agent = await new_agent(Api(), interval=3600)
    api = agent.api
    assert isinstance(api, Api)
    obj = dra_alloc(phase=None)
    key = f"{NS}/{obj['metadata']['name']}"
    agent.allocs[key] = obj
    await agent.serving.reconcile(key)
    name = obj["metadata"]["name"]
    assert api.status[name]["phase"] == names.PHASE_READY
    obj["status"] = api.status[name]

    reader = Reader()
    reader.add(claim_obj(), obj)
    p = await new_plugin(reader)
    agent.serving.use_prepared_claims(p.preparer)
    assert (await p.prepare(("c", UID))).claims[UID].devices

    # The claim is deallocated: the operator deletes the allocation, but the
    # kubelet has not unprepared the claim, so its containers may still run.
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    with pytest.raises(RetryLater, match="still prepared"):
        await agent.serving.reconcile(key)
    assert 100 in agent.vnpus
    assert api.finalizers_removed == []
    assert api.status[name]["phase"] == names.PHASE_RELEASING
    assert [(n, r) for n, r, _ in api.events][-1] == (name, names.REASON_DESTROY_DEFERRED)
    assert f"claim {NS}/c is still prepared on n1" in api.events[-1][2]

    # The kubelet unprepares it: the allocation is queued again at once, and released.
    queued: list[str] = []
    agent.serving.queue.add = queued.append  # type: ignore[method-assign]
    await p.unprepare(("c", UID))
    assert queued == [key]
    await agent.serving.reconcile(key)
    assert 100 not in agent.vnpus
    assert api.finalizers_removed == [name]


async def test_claim_ids_name_the_claim() -> None:
    assert str(ClaimId("ns", "u", "n")) == "ns/n (u)"


async def test_an_agent_simulating_nodes_serves_no_kubelet_plugin(tmp_path: Path) -> None:
    """Its nodes' kubelets (kwok's) call no plugin, and the host's kubelet
    directories are not theirs (docs/DRA.md, "The kubelet plugin")."""
    from vnpu_agent.config import AgentSettings
    from vnpu_agent.main import Agent

    settings = AgentSettings(
        simulate_nodes=["n1"], driver="sim", dra=True, dra_plugins_dir=tmp_path / "p",
        dra_registry_dir=tmp_path / "r", state_dir=tmp_path / "s",
    )  # fmt: skip
    assert await Agent(settings)._kubelet_plugin() is None
    assert not (tmp_path / "p").exists()
