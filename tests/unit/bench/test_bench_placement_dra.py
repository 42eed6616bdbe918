"""The DRA path of the placement benchmark (bench/placement/dra.py): the
scheduler's first fit over a pool's slices in the order they are published,
within the counters, and a node picked at random among those the whole
request fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.placement import dra, offline, workload
from bench.placement.__main__ import SMALL_CHIPS, main

from vnpu_agent.dra.slices import pool_slices


def counters(name: str, **values: int) -> dict[str, Any]:
    return {"name": name, "counters": {k: {"value": str(v)} for k, v in values.items()}}


def device(name: str, template: str, counter_set: str, **uses: int) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"template": {"string": template}},
        "consumesCounters": [
            {"counterSet": counter_set, "counters": {k: {"value": str(v)} for k, v in uses.items()}}
        ],
    }


def sliced(name: str, field: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {field: items}}


def two_chips(order: list[dict[str, Any]]) -> dra.NodePool:
    sets = [counters("a", aicpu=7), counters("b", aicpu=7)]
    return dra.NodePool(
        [
            sliced("n-counters-000", "sharedCounters", sets),
            sliced("n-devices-000", "devices", order),
        ]
    )


def names_of(got: list[dra.Device] | None) -> list[str] | None:
    return None if got is None else [d.name for d in got]


def test_the_first_device_in_the_published_order_is_taken() -> None:
    on_a = device("a-small", "vir01", "a", aicpu=1)
    on_b = device("b-small", "vir01", "b", aicpu=1)
    assert names_of(two_chips([on_b, on_a]).first_fit("vir01", 1)) == ["b-small"]
    assert names_of(two_chips([on_a, on_b]).first_fit("vir01", 1)) == ["a-small"]


def test_slices_are_walked_by_name_not_as_listed() -> None:
    pool = [
        sliced("n-devices-010", "devices", [device("late", "vir01", "a", aicpu=1)]),
        sliced("n-devices-002", "devices", [device("early", "vir01", "a", aicpu=1)]),
        sliced("n-counters-000", "sharedCounters", [counters("a", aicpu=7)]),
    ]
    node = dra.NodePool(pool)
    assert [d.name for d in node.order] == ["early", "late"]
    assert names_of(node.first_fit("vir01", 1)) == ["early"]


def test_a_device_of_another_template_or_already_allocated_is_passed_over() -> None:
    node = two_chips(
        [
            device("a-big", "vir04", "a", aicpu=4),
            device("a-small-0", "vir01", "a", aicpu=1),
            device("a-small-1", "vir01", "a", aicpu=1),
        ]
    )
    first = node.first_fit("vir01", 1)
    assert names_of(first) == ["a-small-0"]
    assert first is not None
    node.allocate(first)
    assert names_of(node.first_fit("vir01", 1)) == ["a-small-1"]


def test_counters_left_decide_whether_a_device_fits() -> None:
    node = two_chips(
        [
            device("a-big", "vir04", "a", aicpu=4),
            *(device(f"a-small-{i}", "vir01", "a", aicpu=1) for i in range(4)),
            device("b-big", "vir04", "b", aicpu=4),
        ]
    )
    smalls = node.first_fit("vir01", 4)
    assert smalls is not None
    node.allocate(smalls)
    # Chip a has 3 AICPU left: its vir04 no longer fits, chip b's does.
    assert names_of(node.first_fit("vir04", 1)) == ["b-big"]
    node.deallocate(smalls)
    assert names_of(node.first_fit("vir04", 1)) == ["a-big"]


def test_a_claim_of_two_counts_what_its_first_device_took() -> None:
    node = dra.NodePool(
        [
            sliced("n-counters-000", "sharedCounters", [counters("a", aicore=10)]),
            sliced("n-devices-000", "devices", [
                device("a-0", "vir06", "a", aicore=6), device("a-1", "vir06", "a", aicore=6),
            ]),
        ]
    )  # fmt: skip
    assert names_of(node.first_fit("vir06", 1)) == ["a-0"]
    assert node.first_fit("vir06", 2) is None


def test_the_published_pool_fills_one_chip_before_the_next() -> None:
    chips = [workload.chip_status("910B3", i) for i in range(2)]
    node = dra.NodePool(pool_slices(chips, (), "n", 1))
    taken = []
    for _ in range(4):
        got = node.first_fit("vir05_1c_16g", 1)
        assert got is not None
        node.allocate(got)
        taken += [d.name for d in got]
    assert all(name.startswith("npu-0-") for name in taken), taken
    assert names_of(node.first_fit("vir10_3c_32g", 1)) == ["npu-1-vir10-3c-32g-0"]


def test_small_vnpus_go_beside_the_largest_before_they_take_a_chip_of_their_own() -> None:
    # Two 310P3: a vir04 takes 4 of a chip's 7 AICPUs. Six vir01 (one AICPU
    # each) in chip order would leave chip 0 with 1 AICPU and one vir04 in
    # all; in the rooms beside the vir04s, three per chip, both stay.
    chips = [workload.chip_status("310P3", i) for i in range(2)]
    node = dra.NodePool(pool_slices(chips, (), "n", 1))
    for _ in range(6):
        got = node.first_fit("vir01", 1)
        assert got is not None
        node.allocate(got)
    assert sorted(names_of(node.first_fit("vir04", 2)) or []) == ["npu-0-vir04-0", "npu-1-vir04-0"]
    # The seventh has no room left beside a vir04: it takes chip 0's own.
    assert names_of(node.first_fit("vir01", 1)) == ["npu-0-vir01-0"]


def test_a_node_is_picked_only_where_the_whole_request_fits_and_at_random() -> None:
    inventories = workload.inventories(2, {"910B3": 1})
    placer = dra.DraPlacer(inventories, seed=1)
    half = workload.Arrival(0, 0.0, 1.0, "vir10_3c_32g", 1, "910B3", True, 10)
    assert placer.place(half)
    busy = placer.live[0][0]
    # Two vir10 fit only on the node that holds none.
    pair = workload.Arrival(1, 0.0, 1.0, "vir10_3c_32g", 2, "910B3", True, 20)
    for seed in range(8):
        other = dra.DraPlacer(inventories, seed=seed)
        assert other.place(half)
        assert other.place(pair)
        assert other.live[1][0] != other.live[0][0]
    assert placer.place(pair)
    assert placer.live[1][0] == 1 - busy
    # Alike empty nodes: the seeds spread the first claim over both.
    picks = set()
    for seed in range(8):
        fresh = dra.DraPlacer(inventories, seed=seed)
        assert fresh.place(half)
        picks.add(fresh.live[0][0])
    assert picks == {0, 1}
    # Released, the pair's devices and counters are free again.
    placer.release(pair)
    placer.release(half)
    assert placer.fits[("vir10_3c_32g", 2)] == {0, 1}


def test_a_full_cluster_refuses_and_a_release_lets_the_next_in() -> None:
    inventories = workload.inventories(1, {"910B3": 1})
    placer = dra.DraPlacer(inventories, seed=3)
    pair = [workload.Arrival(i, 0.0, 1.0, "vir10_3c_32g", 1, "910B3", True, 10) for i in range(3)]
    assert placer.place(pair[0])
    assert placer.place(pair[1])
    assert not placer.place(pair[2])
    placer.release(pair[0])
    assert placer.place(pair[2])


def test_the_dra_path_never_beats_the_offline_best() -> None:
    for seed in (17, 18, 19):
        stream = workload.stream(2.0, 1, 10, seed, chips=SMALL_CHIPS)
        limit = offline.best(stream, 1, SMALL_CHIPS)
        inventories = workload.inventories(1, SMALL_CHIPS)
        placed = dra.run(inventories, stream, seed=seed, waiting=False).placed_now
        assert 0 < placed <= limit, seed


def test_the_replay_is_fixed_by_its_seeds_and_misses_under_load() -> None:
    stream = workload.stream(0.95, 20, 1500, seed=17)
    runs = [
        dra.run(workload.inventories(20), stream, seed=s, warmup=500).placed_now for s in (5, 5, 6)
    ]
    assert runs[0] == runs[1]
    assert all(0 < r < 1000 for r in runs), runs


def test_the_benchmark_reports_a_dra_row_beside_the_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "placement.json"
    argv = ["--nodes", "4", "--arrivals", "60", "--loads", "0.9", "--small-seeds", "1"]
    argv += ["--small-arrivals", "6", "--dra-seeds", "2", "--workers", "1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| dra |" in printed
    result = json.loads(out.read_text())
    (row,) = [r for r in result["online"] if r["policy"] == "dra"]
    assert row["tie_break_seeds"] == [17, 18]
    assert row["requests"] == 2 * (60 - 60 // 3)
    assert len(row["placed_now_fraction_by_seed"]) == 2
    assert "dra" in result["small"][0]
    with pytest.raises(SystemExit):
        main(["--dra-seeds", "0"])
