"""The correctness snapshot's counts, its reads, and the process it runs in."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from bench.snapshot import Spec, aside, read_simulators, tally

from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.drivers.sim.state import SimChip, SimState, SimVnpu

NODES = ["n-0", "n-1"]


def alloc(node: str, chip: int, vnpu_id: int, template: str) -> dict[str, Any]:
    return {"spec": {"nodeName": node, "chip": chip, "vnpuId": vnpu_id, "template": template}}


def chips(*models: str) -> list[SimChip]:
    return [
        SimChip(index=i, model=m, physical_id=i, card_id=i, device_id=0)
        for i, m in enumerate(models)
    ]


def test_double_booked_ids_and_chips_over_capacity_are_counted_from_both_sides() -> None:
    allocs = [
        alloc("n-0", 0, 100, "vir10_3c_32g"),
        alloc("n-0", 0, 100, "vir10_3c_32g"),  # the same id twice
        alloc("n-0", 0, 101, "vir10_3c_32g"),  # three of half a 910B3 on one chip
        alloc("n-1", 0, 100, "vir10_3c_32g"),  # the same id on another node: fine
        alloc("bench-floor", 0, 100, "vir10_3c_32g"),  # not one of these nodes
        alloc("bench-floor", 0, 100, "vir10_3c_32g"),
    ]
    sims = {
        "n-0": SimState(chips=chips("910B3", "310P3")),
        "n-1": SimState(
            chips=chips("910B3"),
            vnpus={v: SimVnpu(v, 0, "vir10_3c_32g") for v in (100, 101, 102)},
        ),
    }
    got = tally(allocs, sims, NODES, final=False)
    assert got == {
        "double_booked_ids": 1,
        "over_capacity_chips_allocations": 1,
        "over_capacity_chips_sim": 1,
    }


def test_the_last_snapshot_counts_leaked_vnpus_and_leftover_allocations() -> None:
    sims = {
        "n-0": SimState(chips=chips("910B3"), vnpus={100: SimVnpu(100, 0, "vir10_3c_32g")}),
        "n-1": SimState(chips=chips("910B3"), vnpus={117: SimVnpu(117, 0, "vir05_1c_16g")}),
    }
    got = tally([alloc("n-0", 0, 100, "vir10_3c_32g")], sims, NODES, final=True)
    assert got["leaked_vnpus"] == 1  # n-1's 117: no allocation names it
    assert got["leftover_allocations"] == 1
    assert tally([], {"n-0": SimState(chips=chips("910B3"))}, NODES, final=True) == {
        "double_booked_ids": 0,
        "over_capacity_chips_allocations": 0,
        "over_capacity_chips_sim": 0,
        "leaked_vnpus": 0,
        "leftover_allocations": 0,
    }


def test_an_unknown_template_or_model_counts_as_over_capacity() -> None:
    sims = {"n-0": SimState(chips=chips("910B3", "9999X"))}
    allocs = [alloc("n-0", 0, 100, "no-such-template"), alloc("n-0", 1, 116, "vir01")]
    got = tally(allocs, sims, NODES, final=False)
    assert got["over_capacity_chips_allocations"] == 2


def test_simulators_are_read_while_an_agent_holds_their_lock(tmp_path: Path) -> None:
    sim = node_sim(tmp_path)
    sim.create_vnpu(0, "vir10_3c_32g", 100)
    lock = os.open(sim.state_path.with_name("state.json.lock"), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        out: dict[str, SimState] = {}
        reader = threading.Thread(
            target=lambda: out.update(read_simulators(Spec([], ["n-0"], str(tmp_path), False)))
        )
        reader.start()
        reader.join(timeout=10)
        # A reader taking the lock would still be waiting for it.
        assert not reader.is_alive()
    finally:
        os.close(lock)
    assert sorted(out["n-0"].vnpus) == [100]


def node_sim(tmp_path: Path, node: str = "n-0") -> SimDriver:
    """A simulated node of one 910B3 where the benchmark's agents keep it."""
    path = tmp_path / node / "sim" / "state.json"
    path.parent.mkdir(parents=True)
    return SimDriver(path, "910B3=1")


def fake_kubectl(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "kubectl"
    script.write_text(f"#!/bin/sh\nnice > {tmp_path / 'niceness'}\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return [str(script)]


def test_a_snapshot_aside_runs_at_the_lowest_priority(tmp_path: Path) -> None:
    sim = node_sim(tmp_path)
    sim.create_vnpu(0, "vir10_3c_32g", 100)
    items = json.dumps({"items": [alloc("n-0", 0, 100, "vir10_3c_32g")] * 2})
    kubectl = fake_kubectl(tmp_path, f"echo '{items}'")
    got = asyncio.run(aside(Spec(kubectl, ["n-0"], str(tmp_path), True)))
    assert got["double_booked_ids"] == 1
    assert got["leaked_vnpus"] == 0
    assert got["leftover_allocations"] == 2
    assert int((tmp_path / "niceness").read_text()) == 19


def test_a_failed_list_is_an_error_not_zero_counts(tmp_path: Path) -> None:
    node_sim(tmp_path)
    kubectl = fake_kubectl(tmp_path, "echo 'the server is down' >&2; exit 1")
    with pytest.raises(RuntimeError, match="the server is down"):
        asyncio.run(aside(Spec(kubectl, ["n-0"], str(tmp_path), False)))
