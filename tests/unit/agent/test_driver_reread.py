"""A resync re-reads the driver chip by chip; a create or destroy made by
another task between two of its calls is newer than its listing and must
survive it. Before, the listing was applied at the end and a destroyed vNPU
came back into the published inventory until the next resync (seen as
VNPUNode writes in the benchmark's idle window at 200 nodes)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from vnpu_agent.drivers.base import VNPU
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.node import NodeAgent

NewAgent = Callable[..., Awaitable[NodeAgent]]

TEMPLATE = "vir05_1c_16g"


class PausingSim(SimDriver):
    """Signals while it lists chip 0's vNPUs and holds that call a moment,
    so the test can queue a driver call behind it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "910B3=2")
        self.listing_chip0 = threading.Event()
        self.pause = False

    def list_vnpus(self, chip: int) -> list[VNPU]:
        found = super().list_vnpus(chip)
        if chip == 0 and self.pause:
            self.listing_chip0.set()
            time.sleep(0.2)
        return found


async def reread_with(agent_call: str, new_agent: NewAgent, tmp_path: Path) -> set[int]:
    sim = PausingSim(tmp_path / "sim.json")
    sim.create_vnpu(0, TEMPLATE, 100)
    agent = await new_agent(object(), driver=sim)
    assert set(agent.vnpus) == {100}
    sim.pause = True
    resync = asyncio.create_task(agent.view.refresh())
    await asyncio.to_thread(sim.listing_chip0.wait, 5)
    # Queued on the driver lock behind the listing of chip 0: runs before chip 1's.
    if agent_call == "destroy":
        await agent.view.call("destroy", sim.destroy_vnpu, 0, 100)
        agent.vnpus.pop(100, None)  # as the release does, right after the call
    else:
        vnpu = await agent.view.call("create", sim.create_vnpu, 0, TEMPLATE, 101)
        agent.vnpus[vnpu.id] = vnpu  # as the create does
    await resync
    assert agent.driver_ok
    return set(agent.vnpus)


async def test_a_vnpu_destroyed_during_a_resync_stays_gone(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    assert await reread_with("destroy", new_agent, tmp_path) == set()


async def test_a_vnpu_created_during_a_resync_stays_known(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    assert await reread_with("create", new_agent, tmp_path) == {100, 101}


async def test_vnpus_of_a_chip_that_is_gone_are_dropped(
    new_agent: NewAgent, tmp_path: Path
) -> None:
    sim = SimDriver(tmp_path / "sim.json", "910B3=2")
    sim.create_vnpu(1, TEMPLATE, 116)
    agent = await new_agent(object(), driver=sim)
    assert set(agent.vnpus) == {116}
    # The node now reports one chip (a card removed): chip 1's vNPU is not present.
    agent.view.driver = SimDriver(tmp_path / "other.json", "910B3=1")
    await agent.view.refresh()
    assert agent.vnpus == {}
