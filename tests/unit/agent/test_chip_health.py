"""What the agent says on its VNPUNode when the driver reports a chip
unhealthy and healthy again: the ChipsHealthy condition, and one Event per
transition (none while nothing changes). End to end, with the operator
avoiding the chip: tests/integration/test_cordon.py."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from agent_helpers import RecordingApi

from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.node import NodeAgent
from vnpu_common.wire import names


@pytest.fixture
def sim(tmp_path: Path) -> SimDriver:
    return SimDriver(tmp_path / "sim.json", "910B3=2")


@pytest.fixture
async def agent(new_agent: Callable[..., Awaitable[NodeAgent]], sim: SimDriver) -> NodeAgent:
    return await new_agent(RecordingApi(), driver=sim)


def chips_healthy(api: RecordingApi) -> dict[str, Any]:
    conditions = api.status["conditions"]
    found = [c for c in conditions if c["type"] == names.COND_CHIPS_HEALTHY]
    assert len(found) == 1, conditions
    return dict(found[0])


async def test_an_unhealthy_chip_is_a_condition_and_an_event_and_recovers(
    agent: NodeAgent, sim: SimDriver
) -> None:
    api = cast(RecordingApi, agent.api)
    await agent.publisher.publish()
    assert chips_healthy(api)["status"] == "True"
    assert api.events == []

    sim.set_chip_health(1, False)
    await agent.publisher.publish()
    cond = chips_healthy(api)
    assert (cond["status"], cond["reason"]) == ("False", names.REASON_CHIP_UNHEALTHY)
    assert "unhealthy chips: 1;" in cond["message"]
    assert [c["health"] for c in api.status["chips"]] == ["Healthy", "Unhealthy"]
    assert api.events == [
        (
            names.NODE_KIND,
            "Warning",
            names.REASON_CHIP_UNHEALTHY,
            "chip 1 of n1 is unhealthy: no new vNPU is placed on it; "
            "its vNPUs stay until their pods end",
        )
    ]
    unhealthy_since = cond["lastTransitionTime"]

    # Still unhealthy: nothing new is said, the condition keeps its time.
    await agent.publisher.publish()
    assert len(api.events) == 1
    assert chips_healthy(api)["lastTransitionTime"] == unhealthy_since

    sim.set_chip_health(1, True)
    await agent.publisher.publish()
    cond = chips_healthy(api)
    assert (cond["status"], cond["reason"]) == ("True", names.REASON_CHIP_HEALTHY)
    assert api.events[1:] == [
        (
            names.NODE_KIND,
            "Normal",
            names.REASON_CHIP_HEALTHY,
            "chip 1 of n1 is healthy again: it takes new vNPUs",
        )
    ]


async def test_a_chip_unhealthy_at_start_is_told_once(agent: NodeAgent, sim: SimDriver) -> None:
    api = cast(RecordingApi, agent.api)
    sim.set_chip_health(0, False)
    await agent.publisher.publish()
    await agent.publisher.publish()
    assert [e[2] for e in api.events] == [names.REASON_CHIP_UNHEALTHY]
    assert chips_healthy(api)["message"].startswith("unhealthy chips: 0;")


async def test_the_status_echoes_the_admins_cordon_for_kubectl_get(agent: NodeAgent) -> None:
    api = cast(RecordingApi, agent.api)
    await agent.publisher.publish()
    assert (api.status["cordoned"], api.status["unhealthy"]) == ("", "")
    meta = {"name": "n1", "labels": {names.LABEL_NODE: "n1"}}
    spec = {"cordonedChips": [{"chip": 1, "reason": "fan"}, {"chip": 0, "reason": "ECC"}]}
    await agent.on_node_event(
        "MODIFIED", {"metadata": meta, "spec": spec, "status": copy.deepcopy(api.status)}
    )
    await asyncio.sleep(0.1)  # the (zero) coalescing interval and the publish it starts
    assert api.status["cordoned"] == "0,1"
    # Its own write's echo (spec unchanged) starts no other write.
    written, writes = copy.deepcopy(api.status), api.writes
    await agent.on_node_event("MODIFIED", {"metadata": meta, "spec": spec, "status": written})
    await asyncio.sleep(0.1)
    assert api.writes == writes
    await agent.on_node_event("MODIFIED", {"metadata": meta, "status": written})
    await asyncio.sleep(0.1)
    assert api.status["cordoned"] == ""
