"""The kubelet plugin as the last line of defense (issue 54, items 1 and 9):
a Prepare in flight holds its vNPU, a Prepare never hands out a vNPU that
another claim or allocation holds or that is not on the driver, a reboot's
checkpoint is checked again, an unreadable checkpoint keeps every deferral,
and the orphan collector leaves what a prepared claim names. The node side is
a real NodeAgent over the simulator; the API reads are a fake fed dicts."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from test_dra_plugin import DEVICE, NODE, NS, UID, Api, Reader, claim_obj, dra_alloc

from vnpu_agent.dra.checkpoint import Checkpoint
from vnpu_agent.dra.prepare import ClaimId, Preparer
from vnpu_agent.node import NodeAgent
from vnpu_common.kube.workqueue import RetryLater
from vnpu_common.wire import names

NewAgent = Callable[..., Awaitable[NodeAgent]]
CLAIM = ClaimId(NS, UID, "c")


class LateReader(Reader):
    """Answers the allocation read at once, then holds the answer at `gate`:
    the window between Prepare's reads and its save, widened."""

    async def allocation(self, namespace: str, name: str) -> Any:
        answer = copy.deepcopy(self.allocs.get((namespace, name)))
        self.reads += 1
        if self.gate is not None:
            self.inside += 1
            await self.gate.wait()
            self.inside -= 1
        return answer


async def served(agent: NodeAgent, obj: dict[str, Any]) -> str:
    """The allocation made Ready by the agent; its key."""
    api = agent.api
    assert isinstance(api, Api)
    key = f"{NS}/{obj['metadata']['name']}"
    agent.allocs[key] = obj
    await agent.serving.reconcile(key)
    obj["status"] = api.status[obj["metadata"]["name"]]
    assert obj["status"]["phase"] == names.PHASE_READY
    return key


async def one_ready_claim(
    new_agent: NewAgent, tmp_path: Path
) -> tuple[NodeAgent, dict[str, Any], Reader, Preparer]:
    """An agent serving claim c's allocation (vNPU 100, Ready), a reader that
    knows both, and a plugin of boot b1 on that agent."""
    agent = await new_agent(Api(), interval=3600)
    obj = dra_alloc(phase=None)
    await served(agent, obj)
    reader = Reader()
    reader.add(claim_obj(), obj)
    return agent, obj, reader, preparer_for(agent, reader, tmp_path)


def deleting(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}


async def inside(reader: Reader) -> None:
    """Until the Prepare is held at the reader's gate."""
    async with asyncio.timeout(5):
        while not reader.inside:  # noqa: ASYNC110 (the reader has no event to wait on)
            await asyncio.sleep(0.01)


def preparer_for(agent: NodeAgent, reader: Reader, tmp_path: Path, boot: str = "b1") -> Preparer:
    p = Preparer(
        NODE, reader, tmp_path / "dra" / "checkpoint.json", tmp_path / "cdi", Path("/dev"),
        guard=agent.serving, boot_id=boot,
    )  # fmt: skip
    agent.serving.use_prepared_claims(p)
    return p


async def test_a_release_during_a_prepare_waits_for_it_and_the_vnpu_survives(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    """The tenant deletes its own claim while the kubelet prepares it: the
    release lands between Prepare's reads and its save. Before, the vNPU was
    destroyed and the Prepare still succeeded, for an id the ledger freed."""
    agent = await new_agent(Api(), interval=3600)
    obj = dra_alloc(phase=None)
    key = await served(agent, obj)
    reader = LateReader()
    reader.add(claim_obj(), obj)
    reader.gate = asyncio.Event()
    p = preparer_for(agent, reader, tmp_path)

    call = asyncio.create_task(p.prepare([CLAIM]))
    await inside(reader)
    # Phase one is on disk before the reads: a crashed agent still holds it.
    assert Checkpoint(p.checkpoint.path, "b1").held(UID) == "being prepared"
    gone = copy.deepcopy(obj)
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    agent.allocs[key] = gone
    with pytest.raises(RetryLater, match="being prepared"):
        await agent.serving.reconcile(key)
    assert 100 in agent.vnpus

    reader.gate.set()
    answer = await call
    assert answer[UID].devices, answer[UID].error
    assert 100 in agent.vnpus  # what the kubelet got exists
    with pytest.raises(RetryLater, match="still prepared"):
        await agent.serving.reconcile(key)
    await p.unprepare([CLAIM])
    await agent.serving.reconcile(key)
    assert 100 not in agent.vnpus


async def test_a_failed_prepare_lets_a_deferred_release_go_at_once(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    agent = await new_agent(Api(), interval=3600)
    obj = dra_alloc(phase=None)
    key = await served(agent, obj)
    reader = LateReader()
    reader.add(claim_obj())  # the allocation is gone from the API already
    reader.gate = asyncio.Event()
    p = preparer_for(agent, reader, tmp_path)
    call = asyncio.create_task(p.prepare([CLAIM]))
    await inside(reader)
    agent.allocs[key] = deleting(obj)
    with pytest.raises(RetryLater):
        await agent.serving.reconcile(key)
    queued: list[str] = []
    agent.serving.queue.add = queued.append  # type: ignore[method-assign]
    reader.gate.set()
    assert "not found" in (await call)[UID].error
    assert queued == [key]
    assert p.holds(UID) is None
    assert UID not in p.checkpoint.entries  # phase one gone with it


async def test_a_vnpu_another_claim_has_prepared_is_refused(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    """A force-deleted pod's claim stays prepared while its containers may
    run; a new claim given the same id (by whatever mistake) gets nothing."""
    agent = await new_agent(Api(), interval=3600)
    first = dra_alloc(phase=None)
    await served(agent, first)
    reader = Reader()
    reader.add(claim_obj(), first)
    p = preparer_for(agent, reader, tmp_path)
    assert (await p.prepare([CLAIM]))[UID].devices
    # Its allocation went (the claim was deallocated); the kubelet has not
    # unprepared it yet.
    agent.allocs.clear()
    second = dra_alloc(uid="uid-2", vnpu_id=100)
    second["spec"]["claim"]["name"] = "c2"
    reader.add(claim_obj(name="c2", uid="uid-2"), second)
    answer = await p.prepare([ClaimId(NS, "uid-2", "c2")])
    assert f"vNPU 100 is still prepared for claim {UID}" in answer["uid-2"].error
    assert not answer["uid-2"].devices


async def test_a_vnpu_another_allocation_names_is_refused(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    agent = await new_agent(Api(), interval=3600)
    pods = dra_alloc(phase=None)
    pods["spec"].pop("claim")  # an annotated pod's allocation of vNPU 100
    pods["metadata"]["name"] = "pod-a"
    await served(agent, pods)
    obj = dra_alloc()
    reader = Reader()
    reader.add(claim_obj(), obj)
    p = preparer_for(agent, reader, tmp_path)
    error = (await p.prepare([CLAIM]))[UID].error
    assert f"vNPU 100 is still held by allocation {NS}/pod-a" in error
    assert p.holds(UID) is None


async def test_two_devices_naming_one_vnpu_are_refused(new_agent: NewAgent, tmp_path: Path) -> None:
    agent = await new_agent(Api(), interval=3600)
    a = dra_alloc(phase=None)
    await served(agent, a)
    b = dra_alloc(device="npu-0-vir05-1c-16g-1", vnpu_id=100)
    reader = Reader()
    reader.add(claim_obj(devices=[DEVICE, "npu-0-vir05-1c-16g-1"]), a, b)
    p = preparer_for(agent, reader, tmp_path)
    assert "vNPU 100 is named twice" in (await p.prepare([CLAIM]))[UID].error


async def test_a_vnpu_that_is_not_on_the_driver_is_refused(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    agent = await new_agent(Api(), interval=3600)
    obj = dra_alloc()  # Ready in the API, but the agent never made vNPU 100
    reader = Reader()
    reader.add(claim_obj(), obj)
    p = preparer_for(agent, reader, tmp_path)
    assert f"vNPU 100 (vir05_1c_16g) not on {NODE}" in (await p.prepare([CLAIM]))[UID].error


async def test_after_a_reboot_prepare_checks_again_and_rebuilds_the_spec(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    agent, obj, reader, p = await one_ready_claim(new_agent, tmp_path)
    assert (await p.prepare([CLAIM]))[UID].devices
    spec = next((tmp_path / "cdi").iterdir())

    # The node reboots: the CDI directory (a tmpfs) is empty, the vNPU gone.
    spec.unlink()
    await agent.view.call("destroy", agent.view.driver.destroy_vnpu, 0, 100)
    agent.view.removed(100)
    rebooted = preparer_for(agent, reader, tmp_path, boot="b2")
    # No container survived the reboot: the old entry holds nothing.
    assert rebooted.holds(UID) is None
    assert 100 not in rebooted.prepared_ids()
    error = (await rebooted.prepare([CLAIM]))[UID].error
    assert "not on n1 (after a reboot the agent creates it again)" in error
    assert not spec.exists()

    # The agent puts the vNPU back for the live allocation; the retry succeeds.
    await agent.serving.reconcile(f"{NS}/{obj['metadata']['name']}")
    assert 100 in agent.vnpus
    assert (await rebooted.prepare([CLAIM]))[UID].devices
    assert spec.exists()
    assert rebooted.holds(UID) == "prepared"


async def test_the_orphan_collector_leaves_what_a_prepared_claim_names(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    agent, _obj, _reader, p = await one_ready_claim(new_agent, tmp_path)
    assert (await p.prepare([CLAIM]))[UID].devices
    agent.allocs.clear()  # its allocation gone by another way than the agent's destroy
    assert 100 in agent.referenced_ids()
    await p.unprepare([CLAIM])
    assert 100 not in agent.referenced_ids()


async def test_an_unreadable_checkpoint_holds_every_claim_until_the_kubelet_says(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    agent = await new_agent(Api(), interval=3600)
    obj = dra_alloc(phase=None)
    key = await served(agent, obj)
    reader = Reader()
    reader.add(claim_obj(), obj)
    p = preparer_for(agent, reader, tmp_path)
    assert (await p.prepare([CLAIM]))[UID].devices
    path = p.checkpoint.path
    path.write_text(path.read_text()[:40])  # a disk that lost the end of the file

    restarted = preparer_for(agent, Reader(), tmp_path)
    assert restarted.checkpoint.entries == {}
    assert path.with_suffix(".broken").exists()
    # A running pod's deferral is kept: the release waits for the kubelet.
    agent.allocs[key] = deleting(obj)
    with pytest.raises(RetryLater, match="checkpoint was unreadable"):
        await agent.serving.reconcile(key)
    assert 100 in agent.vnpus
    assert "checkpoint was unreadable" in (restarted.holds("any-other-claim") or "")

    # The kubelet unprepares the claim: that one goes, across another restart.
    await restarted.unprepare([CLAIM])
    assert restarted.holds(UID) is None
    again = preparer_for(agent, Reader(), tmp_path)
    assert again.holds(UID) is None
    assert again.holds("any-other-claim") is not None
    await agent.serving.reconcile(key)
    assert 100 not in agent.vnpus

    # The way out once nothing uses the vNPUs: remove the kept file.
    path.with_suffix(".broken").unlink()
    assert again.holds("any-other-claim") is None


async def test_a_checkpoint_whose_checksum_does_not_match_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    first = Checkpoint(path, "b1")
    first.save()
    data = json.loads(path.read_text())
    data["claims"]["forged"] = {"namespace": NS, "name": "x", "phase": "PrepareCompleted",
                                "bootId": "b1", "devices": []}  # fmt: skip
    path.write_text(json.dumps(data))
    second = Checkpoint(path, "b1")
    assert "forged" not in second.entries
    assert second.broken


async def test_a_version_1_checkpoint_is_read_as_prepared_in_this_boot(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    device = {"request": "npu", "pool": NODE, "device": DEVICE, "vnpuId": 100,
              "template": "vir05_1c_16g", "cdiIds": ["x"]}  # fmt: skip
    claims = {UID: {"namespace": NS, "name": "c", "devices": [device]}}
    path.write_text(json.dumps({"version": 1, "claims": claims}))
    c = Checkpoint(path, "b7")
    assert c.held(UID) == "prepared"
    assert c.held_ids() == {100: UID}


async def test_admin_access_is_refused_by_the_plugin(new_agent: NewAgent, tmp_path: Path) -> None:
    agent = await new_agent(Api(), interval=3600)
    claim = claim_obj()
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    reader = Reader()
    reader.add(claim, dra_alloc())
    p = preparer_for(agent, reader, tmp_path)
    assert "admin access to vNPUs is not supported" in (await p.prepare([CLAIM]))[UID].error
