"""NodeAgent's bookkeeping of its own VNPUNode, event by event: the orders
of events and write answers the real plane produces too rarely to test
there (a late echo of an earlier write, a deletion while a write is in
flight). The end-to-end behaviour is tested in
tests/integration/test_agent_vnpunode.py."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_agent import mirror as mirror_module
from vnpu_agent import publisher as publisher_module
from vnpu_agent.node import NodeAgent
from vnpu_common.kube.backoff import Backoff
from vnpu_common.wire import names

SETTLE = 0.05


class RecordingApi:
    """Stands in for AgentApi's VNPUNode writes: keeps the one object a
    server would hold and answers each write with it."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.writes: list[str] = []
        self.gate: asyncio.Event | None = None  # holds a write in flight while set
        self.fail_next = 0  # writes applied but answered 504 (the server timed out)

    def _answer(self) -> dict[str, Any]:
        assert self.obj is not None
        self.rv += 1
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.obj)

    def _create(self, node: str) -> None:
        self.obj = {"metadata": {"name": node, "labels": {names.LABEL_NODE: node}}}

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append("status")
        if self.obj is None:
            self._create(node)
        assert self.obj is not None
        self.obj["status"] = copy.deepcopy(status)
        answer = self._answer()
        if self.gate is not None:
            await self.gate.wait()  # written, but the answer is on its way
        if self.fail_next:
            self.fail_next -= 1
            raise ApiException(status=504, reason="Gateway Timeout")
        return answer

    async def restore_node(
        self, node: str, status: dict[str, Any], *, exists: bool
    ) -> dict[str, Any]:
        self.writes.append(f"restore(exists={exists})")
        if self.obj is None:
            self._create(node)
        assert self.obj is not None
        self.obj["metadata"]["labels"] = {names.LABEL_NODE: node}
        self.obj["status"] = copy.deepcopy(status)
        return self._answer()


@pytest.fixture
def api() -> RecordingApi:
    return RecordingApi()


@pytest.fixture
async def agent(
    new_agent: Callable[..., Awaitable[NodeAgent]],
    api: RecordingApi,
    monkeypatch: pytest.MonkeyPatch,
) -> NodeAgent:
    monkeypatch.setattr(publisher_module, "RESTORE_SETTLE_SECONDS", SETTLE)
    return await new_agent(api)


def served(api: RecordingApi) -> dict[str, Any]:
    """A copy of the object the fake server holds."""
    assert api.obj is not None
    return copy.deepcopy(api.obj)


def someone_edits(api: RecordingApi) -> dict[str, Any]:
    """Someone else zeroes a chip's free AICore on the server; returns the
    status as it was (ours)."""
    assert api.obj is not None
    ours: dict[str, Any] = copy.deepcopy(api.obj["status"])
    api.obj["status"]["chips"][0]["aicoreFree"] = 0
    api.rv += 1
    api.obj["metadata"]["resourceVersion"] = str(api.rv)
    return ours


def restorations(agent: NodeAgent) -> float | None:
    """The agent's count of status restorations (None: never counted)."""
    return agent.metrics.registry.get_sample_value(
        "vnpu_agent_vnpunode_restorations_total", {"node": "n1", "what": "status"}
    )


async def settle() -> None:
    """Past the settle delay and the (zero) coalescing interval, and the publish it starts."""
    await asyncio.sleep(SETTLE * 4)


async def test_a_late_echo_of_an_earlier_write_causes_no_write(
    agent: NodeAgent, api: RecordingApi
) -> None:
    await agent.publisher.publish()
    first = copy.deepcopy(api.obj)
    agent.chips[0] = dataclasses.replace(agent.chips[0], aicore_free=0)
    agent.view.ok = False  # keep the edited chip: publish must not re-read the driver
    await agent.publisher.publish()
    assert api.writes == ["status", "status"]
    # The watch delivers the first write's echo after the second write's answer...
    assert first is not None
    await agent.on_node_event("MODIFIED", first)
    # ...and the second's right behind it, within the settle delay.
    await agent.on_node_event("MODIFIED", served(api))
    await settle()
    assert api.writes == ["status", "status"]


async def test_an_echo_later_than_the_settle_delay_causes_no_write(
    agent: NodeAgent, api: RecordingApi
) -> None:
    # On a loaded API server the watch runs seconds behind the answers: the
    # echoes of two writes arrive long after both answers, with a pause
    # between them several times the settle delay.
    await agent.publisher.publish()
    first = served(api)
    agent.chips[0] = dataclasses.replace(agent.chips[0], aicore_free=0)
    agent.view.ok = False
    await agent.publisher.publish()
    second = served(api)
    await agent.on_node_event("MODIFIED", first)
    await settle()
    await settle()
    assert api.writes == ["status", "status"]
    await agent.on_node_event("MODIFIED", second)
    await settle()
    assert api.writes == ["status", "status"]
    assert restorations(agent) is None


async def test_a_change_after_the_echo_is_restored_without_waiting_for_the_bound(
    agent: NodeAgent, api: RecordingApi
) -> None:
    await agent.publisher.publish()
    await agent.on_node_event("MODIFIED", served(api))  # the echo
    ours = someone_edits(api)
    await agent.on_node_event("MODIFIED", served(api))
    await settle()
    assert api.writes == ["status", "status"]
    assert served(api)["status"] == ours
    assert restorations(agent) == 1.0


async def test_without_its_echo_a_difference_is_restored_after_the_bound(
    agent: NodeAgent, api: RecordingApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Should the echo of our write be lost in a way not foreseen (a listing
    # ends the wait), a foreign change must still be put back, after the bound.
    monkeypatch.setattr(mirror_module, "ECHO_WAIT_SECONDS", SETTLE * 6)
    await agent.publisher.publish()
    ours = someone_edits(api)
    await agent.on_node_event("ADDED", served(api))
    await settle()
    assert api.writes == ["status"]  # within the bound: maybe the watch is behind
    await settle()
    await settle()
    assert api.writes == ["status", "status"]
    assert served(api)["status"] == ours


async def test_a_write_that_failed_is_written_again_and_its_echo_restores_nothing(
    agent: NodeAgent, api: RecordingApi, caplog: pytest.LogCaptureFixture
) -> None:
    agent.publisher._backoff = Backoff(base=SETTLE, cap=SETTLE)
    await agent.publisher.publish()
    await agent.on_node_event("MODIFIED", served(api))
    agent.view.ok = False
    agent.chips[0] = dataclasses.replace(agent.chips[0], aicore_free=0)
    api.fail_next = 2  # an overloaded API server: applied, answered 504, twice
    with pytest.raises(ApiException):
        await agent.publisher.publish()
    # The watch shows the write that failed: ours, not someone else's.
    await agent.on_node_event("MODIFIED", served(api))
    await settle()
    await settle()
    await settle()
    assert api.writes == ["status", "status", "status", "status"]  # failed twice, then written
    assert "VNPUNode n1: status write failed (504 Gateway Timeout)" in caplog.text
    assert restorations(agent) is None
    assert api.obj is not None
    assert api.obj["status"]["chips"][0]["aicoreFree"] == 0
    await agent.on_node_event("MODIFIED", served(api))
    await settle()
    assert len(api.writes) == 4


async def test_a_status_edited_by_someone_else_is_written_back(
    agent: NodeAgent, api: RecordingApi
) -> None:
    await agent.publisher.publish()
    assert api.obj is not None
    ours = copy.deepcopy(api.obj["status"])
    api.obj["status"]["chips"][0]["aicoreFree"] = 0
    await agent.on_node_event("MODIFIED", copy.deepcopy(api.obj))
    assert api.writes == ["status"]  # not at once: the settle delay first
    await settle()
    assert api.writes == ["status", "status"]
    assert api.obj["status"] == ours
    await agent.on_node_event("MODIFIED", copy.deepcopy(api.obj))  # the restoration's echo
    await settle()
    assert api.writes == ["status", "status"]


async def test_a_deletion_during_a_write_is_not_hidden_by_its_answer(
    agent: NodeAgent, api: RecordingApi
) -> None:
    await agent.publisher.publish()
    await agent.on_node_event("ADDED", served(api))
    api.gate = asyncio.Event()
    agent.view.ok = False
    agent.chips.pop()  # a change, so that publish writes
    write = asyncio.create_task(agent.publisher.publish())
    await asyncio.sleep(0)
    assert api.writes[-1] == "status"
    # Deleted while the write's answer is on its way: the watch delivers the
    # write's echo, then the deletion, before the answer arrives.
    await agent.on_node_event("MODIFIED", served(api))
    api.rv += 1
    deleted = served(api)
    deleted["metadata"]["resourceVersion"] = str(api.rv)
    api.obj = None
    await agent.on_node_event("DELETED", deleted)
    api.gate.set()
    await write
    api.gate = None
    await settle()
    await settle()
    assert api.writes[-1] == "restore(exists=False)"
    assert served(api)["metadata"]["labels"] == {names.LABEL_NODE: "n1"}


async def test_a_relabelled_vnpunode_gets_its_label_back(
    agent: NodeAgent, api: RecordingApi
) -> None:
    await agent.publisher.publish()
    assert api.obj is not None
    api.obj["metadata"]["labels"] = {names.LABEL_NODE: "n2"}  # another node of this process
    await agent.on_node_event("MODIFIED", copy.deepcopy(api.obj))
    await settle()
    assert api.writes == ["status", "restore(exists=True)"]
    assert api.obj["metadata"]["labels"] == {names.LABEL_NODE: "n1"}


async def test_nothing_is_compared_before_the_first_write(
    agent: NodeAgent, api: RecordingApi
) -> None:
    # The watch lists the VNPUNode an earlier run of the agent left: the
    # agent's first publish writes anyway, no restoration is due.
    await agent.on_node_event("SYNC", {"metadata": {"name": "n1"}, "status": {"driver": "x"}})
    await settle()
    assert api.writes == []


def restored_as(agent: NodeAgent, what: str) -> float | None:
    return agent.metrics.registry.get_sample_value(
        "vnpu_agent_vnpunode_restorations_total", {"node": "n1", "what": what}
    )


async def test_a_label_taken_off_under_a_write_in_flight_is_put_back(
    agent: NodeAgent, api: RecordingApi
) -> None:
    # The label goes while a status write is on its way; the write lands on
    # the unlabelled object. Its echo never comes (the watch selects on the
    # label): waiting for it would leave the VNPUNode unlabelled for the
    # bound's ten minutes.
    await agent.publisher.publish()
    await agent.on_node_event("ADDED", served(api))
    agent.view.ok = False
    agent.chips.pop()  # a change, so that publish writes
    assert api.obj is not None
    api.obj["metadata"]["labels"] = {}
    api.rv += 1
    api.obj["metadata"]["resourceVersion"] = str(api.rv)
    unlabelled = served(api)
    api.gate = asyncio.Event()
    write = asyncio.create_task(agent.publisher.publish())
    await asyncio.sleep(0)
    await agent.on_node_event("DELETED", unlabelled)
    api.gate.set()
    await write
    api.gate = None
    await settle()
    await settle()
    assert api.writes[-1] == "restore(exists=True)"
    assert served(api)["metadata"]["labels"] == {names.LABEL_NODE: "n1"}
    assert restored_as(agent, "unlabelled") == 1.0


async def test_a_removal_put_back_by_a_write_due_anyway_is_counted(
    agent: NodeAgent, api: RecordingApi
) -> None:
    # A write already due (here: a changed chip) runs before the settle
    # check and puts the VNPUNode back: the restoration is counted all the same.
    await agent.publisher.publish()
    await agent.on_node_event("ADDED", served(api))
    gone = served(api)
    api.obj = None
    await agent.on_node_event("DELETED", gone)
    agent.view.ok = False
    agent.chips.pop()
    await agent.publisher.publish()
    assert api.writes == ["status", "restore(exists=False)"]
    await agent.on_node_event("ADDED", served(api))
    await settle()
    assert api.writes == ["status", "restore(exists=False)"]
    assert restored_as(agent, "deleted") == 1.0
