"""Several processes acting on one simulator state at once."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from pathlib import Path

from vnpu_agent.drivers.base import ANY_VNPU_ID, CapacityError, DriverError
from vnpu_agent.drivers.sim import SimDriver

MakeSim = Callable[..., SimDriver]
ROUNDS = 12


def _churn(state: str, chip: int, template: str, queue: multiprocessing.Queue[object]) -> None:
    """Creates with driver-picked ids until the chip is full, destroys all, repeats."""
    sim = SimDriver(state)
    created = refused = overbooked = 0
    try:
        for _ in range(ROUNDS):
            mine: list[int] = []
            while True:
                try:
                    mine.append(sim.create_vnpu(chip, template, ANY_VNPU_ID).id)
                    created += 1
                    info = sim.list_chips()[chip]
                    if min(info.aicore_free, info.memory_free_mb, info.aicpu_free) < 0:
                        overbooked += 1
                except CapacityError:
                    refused += 1
                    break
            for vnpu_id in mine:
                sim.destroy_vnpu(chip, vnpu_id)
        queue.put((created, refused, overbooked))
    except (DriverError, OSError) as exc:  # reported to the test, not lost
        queue.put(exc)


def _flipper(state: str, vnpu_id: int, queue: multiprocessing.Queue[object]) -> None:
    sim = SimDriver(state)
    for _ in range(ROUNDS * 3):
        sim.open_vnpu(vnpu_id)
        sim.release_vnpu(vnpu_id)
    queue.put("done")


def test_two_processes_never_oversubscribe_a_chip(make_sim: MakeSim, state_path: Path) -> None:
    sim = make_sim("910B3=1")
    sim.create_vnpu(0, "vir05_1c_16g", 115)  # held throughout, flipped by a third process
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = ctx.Queue()
    workers = [
        ctx.Process(target=_churn, args=(str(state_path), 0, "vir05_1c_16g", queue)),
        ctx.Process(target=_churn, args=(str(state_path), 0, "vir05_1c_16g", queue)),
        ctx.Process(target=_flipper, args=(str(state_path), 115, queue)),
    ]
    for w in workers:
        w.start()
    results = [queue.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(timeout=10)
    assert "done" in results
    counts = [r for r in results if r != "done"]
    assert all(isinstance(r, tuple) for r in counts), counts
    # Each worker hits the wall once a round; the chip was never overbooked.
    assert sum(c[1] for c in counts) == 2 * ROUNDS  # type: ignore[index]
    assert sum(c[2] for c in counts) == 0  # type: ignore[index]
    assert sum(c[0] for c in counts) >= 3  # type: ignore[index]
    data = json.loads(state_path.read_text())  # still whole JSON
    assert [v["id"] for v in data["vnpus"]] == [115]
    chip = sim.list_chips()[0]
    assert (chip.aicore_free, chip.aicpu_free) == (15, 6)
    assert sim.snapshot()["recover_lines"] == [
        "0:115:npu-smi set -t create-vnpu -i 0 -c 0 -f vir05_1c_16g -v 115"
    ]


def test_concurrent_creates_of_one_id_give_it_to_one_process(
    make_sim: MakeSim, state_path: Path
) -> None:
    make_sim("910B3=1")
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = ctx.Queue()

    def create_same() -> None:
        try:
            SimDriver(state_path).create_vnpu(0, "vir05_1c_16g", 104)
            queue.put("created")
        except DriverError as exc:
            queue.put(type(exc).__name__)

    workers = [ctx.Process(target=create_same) for _ in range(4)]
    for w in workers:
        w.start()
    results = sorted(str(queue.get(timeout=60)) for _ in workers)
    for w in workers:
        w.join(timeout=10)
    assert results == ["InvalidIdError"] * 3 + ["created"]
