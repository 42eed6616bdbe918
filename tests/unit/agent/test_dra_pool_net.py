"""The DRA pool published net of the capacity no allocated device accounts
for (issue 54, item 3): a chip's counters are its totals less the sizes of
the vNPUs on it that no live claim allocation of the node names: foreign
vNPUs, orphans inside the GC grace period, vNPUs from before the node
served DRA, deferred destroys. A vNPU created or destroyed for a live claim
writes nothing (the scheduler subtracts allocated devices itself), nor does
a normal release (allocation deleted, destroy a moment later). And a
cordoned or unhealthy chip offers no device at all (item 5).

Pure function: vnpu_agent.dra.slices.held_capacity and pool_slices; wired:
NodeAgent (its VNPUNode publisher feeds the pool)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any, cast

from agent_helpers import RecordingApi, allocation
from test_dra_pool import FakeSlices, dra_agent, pool_of
from test_dra_pool_slices import chip, counter_sets, devices

from vnpu_agent.dra import slices
from vnpu_agent.dra.slices import Held, Present
from vnpu_agent.drivers.sim import SimDriver
from vnpu_common.wire import names

NODE = "n1"


def claim_alloc(
    name: str, vnpu_id: int, *, template: str = "vir10_3c_32g", chip_index: int = 0
) -> dict[str, Any]:
    """A claim's VNPUAllocation on n1 (the operator's, for device `name`)."""
    obj = allocation(name, vnpu_id, template=template)
    obj["spec"]["chip"] = chip_index
    obj["spec"]["claim"] = {"name": "c", "uid": f"claim-{name}", "request": "npu", "device": name}
    return obj


def releasing(obj: dict[str, Any], *, deferred: bool) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    if deferred:
        out["status"] = {"phase": names.PHASE_RELEASING, "message": "still prepared"}
    return out


def counters(pool: list[dict[str, Any]], chip_index: int) -> dict[str, int]:
    (found,) = [c for c in counter_sets(pool) if c["name"] == f"npu-{chip_index}"]
    return {k: int(v["value"]) for k, v in found["counters"].items()}


def fits(pool: list[dict[str, Any]], chip_index: int) -> list[str]:
    """The devices of chip `chip_index` that the scheduler could allocate on
    an otherwise empty pool: every counter each consumes is available."""
    left = counters(pool, chip_index)
    out = []
    for d in devices(pool):
        (used,) = d["consumesCounters"]
        if used["counterSet"] != f"npu-{chip_index}":
            continue
        if all(int(v["value"]) <= left[k] for k, v in used["counters"].items()):
            out.append(d["name"])
    return out


TWO_VIR10 = [Present(100, 0, "vir10_3c_32g"), Present(101, 0, "vir10_3c_32g")]


def test_a_foreign_vnpu_on_a_full_chip_leaves_nothing_to_allocate() -> None:
    """Fails before issue 54: the counters were the chip's totals whatever it held."""
    chips = [chip(0), chip(1)]
    held = slices.held_capacity(chips, TWO_VIR10, [], NODE)
    assert held == {0: Held(aicore=20, memory_mb=65536, aicpu=6, media=8, vnpus=2)}
    pool = slices.pool_slices(chips, [], NODE, 1, held=held)
    assert counters(pool, 0) == {
        "aicore": 0, "memory-mb": 0, "aicpu": 1, "media": 1, "vnpus": 14,
    }  # fmt: skip
    assert fits(pool, 0) == []
    # The other chip is untouched, and chip 0 still lists its devices: they
    # exist, the counters are what block them.
    assert counters(pool, 1)["aicore"] == 20
    assert len(fits(pool, 1)) == 6
    assert len([d for d in devices(pool) if d["name"].startswith("npu-0-")]) == 6


def test_a_half_taken_chip_offers_only_what_still_fits() -> None:
    held = slices.held_capacity([chip(0)], TWO_VIR10[:1], [], NODE)
    pool = slices.pool_slices([chip(0)], [], NODE, 1, held=held)
    # 10 AICore and 32 GB left: vir05 and vir10 devices still fit one by one
    # (the scheduler subtracts each allocated one from what is left).
    assert counters(pool, 0)["aicore"] == 10
    assert counters(pool, 0)["memory-mb"] == 32768
    assert len(fits(pool, 0)) == 6


def test_live_claim_vnpus_hold_nothing_and_being_released_ones_only_once_deferred() -> None:
    chips = [chip(0)]
    live = [claim_alloc("a", 100), claim_alloc("b", 101)]
    # Live claim allocations: the scheduler counts their devices already.
    assert slices.held_capacity(chips, TWO_VIR10, live, NODE) == {}
    # A release in progress (allocation being deleted, destroy not deferred):
    # held by nobody yet, so a normal release writes nothing.
    normal = [releasing(live[0], deferred=False), live[1]]
    assert slices.held_capacity(chips, TWO_VIR10, normal, NODE) == {}
    # Its destroy deferred (the claim still prepared): held from then on.
    deferred = [releasing(live[0], deferred=True), live[1]]
    assert slices.held_capacity(chips, TWO_VIR10, deferred, NODE) == {
        0: Held(aicore=10, memory_mb=32768, aicpu=3, media=4, vnpus=1)
    }


def test_what_no_claim_of_this_node_accounts_for_is_held() -> None:
    chips = [chip(0)]
    one = TWO_VIR10[:1]
    size = {0: Held(aicore=10, memory_mb=32768, aicpu=3, media=4, vnpus=1)}
    # An annotated pod's allocation (a node switched modes): not the scheduler's.
    assert slices.held_capacity(chips, one, [allocation("p", 100, template="vir10_3c_32g")], NODE)
    # Another node's claim, another chip, another template: not this vNPU.
    other_node = claim_alloc("a", 100)
    other_node["spec"]["nodeName"] = "n2"
    other_chip = claim_alloc("a", 100, chip_index=1)
    other_template = claim_alloc("a", 100, template="vir05_1c_16g")
    for alloc in (other_node, other_chip, other_template):
        assert slices.held_capacity(chips, one, [alloc], NODE) == size, alloc
    # A vNPU of a template the chip does not offer holds the whole chip.
    whole = slices.held_capacity(chips, [Present(100, 0, "vir99_by_hand")], [], NODE)
    pool = slices.pool_slices(chips, [], NODE, 1, held=whole)
    assert set(counters(pool, 0).values()) == {0}


def test_a_cordoned_or_unhealthy_chip_offers_no_device_even_to_a_toleration() -> None:
    """Fails before issue 54: their devices were listed with a NoSchedule
    taint, which `tolerations: [{operator: Exists}]` defeats."""
    pool = slices.pool_slices([chip(0), chip(1, healthy=False), chip(2)], [2], NODE, 1)
    listed = {d["name"] for d in devices(pool)}
    assert listed
    assert all(n.startswith("npu-0-") for n in listed)
    assert not any(d.get("taints") for d in devices(pool))
    assert len(counter_sets(pool)) == 3


# -- wired: the node agent feeds the pool ---------------------------------------


async def test_a_foreign_vnpu_writes_the_pool_and_a_live_claims_vnpu_does_not(
    tmp_path: Path,
) -> None:
    """Fails before issue 54 (a foreign vNPU changed no slice)."""
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake)
    pool = pool_of(agent)
    await agent.publisher.publish()
    await pool.sync()
    writes = len(fake.writes)
    sim = cast(SimDriver, agent.view.driver)

    # A live claim's vNPU: nothing to write.
    await agent.on_event("ADDED", claim_alloc("a", 100))
    sim.create_vnpu(0, "vir10_3c_32g", 100)
    pool._wake.clear()
    await agent.view.refresh()
    await agent.publisher.publish()
    assert cast(RecordingApi, agent.api).status["vnpuCount"] == 1
    assert not pool._wake.is_set()

    # A foreign one (made by hand): the counters drop by its size.
    sim.create_vnpu(0, "vir10_3c_32g", 101)
    await agent.view.refresh()
    await agent.publisher.publish()
    assert pool._wake.is_set()
    await pool.sync()
    assert len(fake.writes) == writes + 2  # both slices, next generation
    (counter_slice,) = [o for n, o in fake.objects.items() if "counters" in n]
    npu0 = counter_slice["spec"]["sharedCounters"][0]["counters"]
    assert (npu0["aicore"], npu0["vnpus"]) == ({"value": "10"}, {"value": "15"})


async def test_an_allocation_event_moves_what_is_held_without_a_status_write(
    tmp_path: Path,
) -> None:
    """The deferred destroy is seen from the allocation's own event (phase
    Releasing), and its end from the vNPU gone."""
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake)
    pool = pool_of(agent)
    alloc = claim_alloc("a", 100)
    await agent.on_event("ADDED", alloc)
    cast(SimDriver, agent.view.driver).create_vnpu(0, "vir10_3c_32g", 100)
    await agent.view.refresh()
    await agent.publisher.publish()
    await pool.sync()
    pool._wake.clear()

    await agent.on_event("MODIFIED", releasing(alloc, deferred=False))
    assert not pool._wake.is_set()
    await agent.on_event("MODIFIED", releasing(alloc, deferred=True))
    assert pool._wake.is_set()
    await pool.sync()
    (counter_slice,) = [o for n, o in fake.objects.items() if "counters" in n]
    assert counter_slice["spec"]["sharedCounters"][0]["counters"]["aicore"] == {"value": "10"}

    # Destroyed at last: the chip's whole room is back.
    pool._wake.clear()
    agent.view.driver.destroy_vnpu(0, 100)
    agent.view.removed(100)
    await agent.on_event("DELETED", releasing(alloc, deferred=True))
    assert pool._wake.is_set()
    await pool.sync()
    (counter_slice,) = [o for n, o in fake.objects.items() if "counters" in n]
    assert counter_slice["spec"]["sharedCounters"][0]["counters"]["aicore"] == {"value": "20"}


async def test_an_allocation_gone_while_its_vnpu_stands_is_held(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake)
    pool = pool_of(agent)
    alloc = claim_alloc("a", 100)
    await agent.on_event("ADDED", alloc)
    cast(SimDriver, agent.view.driver).create_vnpu(0, "vir10_3c_32g", 100)
    await agent.view.refresh()
    await agent.publisher.publish()
    pool._wake.clear()
    # Its finalizer removed by someone else before the destroy: abandoned.
    await agent.on_event("DELETED", alloc)
    assert pool._wake.is_set()
    await asyncio.sleep(0)
