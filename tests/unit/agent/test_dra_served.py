"""An agent without --dra asks for ResourceSlices only on the nodes that
served DRA when it last ran (vnpu_agent/dra/served.py): an annotation agent
has no right to read them, and every start would be a 403 in the audit log."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kubernetes_asyncio import client

from vnpu_agent.config import AgentSettings
from vnpu_agent.dra import served
from vnpu_agent.main import Agent


def test_the_marker_follows_the_nodes(tmp_path: Path) -> None:
    assert served.marked(tmp_path, ["n1", "n2"]) == []
    served.mark(tmp_path, ["n1"])
    assert served.marked(tmp_path, ["n1", "n2"]) == ["n1"]
    served.unmark(tmp_path, ["n1", "n2"])
    assert served.marked(tmp_path, ["n1", "n2"]) == []


async def test_an_annotation_agent_asks_only_where_a_pool_may_be_left(tmp_path: Path) -> None:
    settings = AgentSettings(simulate_nodes=["n1", "n2"], driver="sim", state_dir=tmp_path)
    agent = Agent(settings)
    agent.api_client = client.ApiClient()
    try:
        assert agent._dra_tasks(None, {}) == []  # never served DRA: no request at all
        served.mark(tmp_path, ["n2"])
        (task,) = agent._dra_tasks(None, {})
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await agent.api_client.close()


async def test_a_dra_agent_marks_its_nodes_before_they_publish(tmp_path: Path) -> None:
    settings = AgentSettings(simulate_nodes=["n1"], driver="sim", dra=True, state_dir=tmp_path)
    agent = Agent(settings)
    agent.api_client = object()  # type: ignore[assignment]
    tasks = agent._dra_tasks(_NoSlices(), {})  # type: ignore[arg-type]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert served.marked(tmp_path, ["n1"]) == ["n1"]


class _NoSlices:
    def list_call(self, _pools: object) -> object:
        return None
