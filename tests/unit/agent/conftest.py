"""A node agent on a simulated node, as the agent unit tests build it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from vnpu_agent.config import AgentSettings
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.node import NodeAgent

NewAgent = Callable[..., Awaitable[NodeAgent]]


@pytest.fixture
def new_agent(tmp_path: Path) -> NewAgent:
    """`await new_agent(api, driver=None, chips="910B3=2", interval=0, settle=0)`:
    agent "n1" writing through the fake `api`, its driver read once. Without
    `driver`, a simulator of `chips`; `interval` is the inventory's minimum
    interval in seconds, `settle` its settle interval (0: every change is
    written at the minimum interval)."""

    async def make(
        api: Any,
        *,
        driver: SimDriver | None = None,
        chips: str = "910B3=2",
        interval: float = 0,
        settle: float = 0,
    ) -> NodeAgent:
        settings = AgentSettings(
            simulate_nodes=["n1"],
            state_dir=tmp_path / "state",
            cdi_dir=tmp_path / "cdi",
            inventory_min_interval_seconds=interval,
            inventory_settle_seconds=settle,
        )
        sim = driver if driver is not None else SimDriver(tmp_path / "sim.json", chips)
        agent = NodeAgent(
            "n1", sim, cast(AgentApi, api), settings, AgentMetrics(), synced=lambda: True
        )
        await agent.view.refresh()
        return agent

    return make
