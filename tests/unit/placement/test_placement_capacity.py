"""Chip capacity: every resource fills and denies, coexistence, vNPU ids."""

from __future__ import annotations

from typing import Any

import pytest
from placement_helpers import GB, chip, node, request

from vnpu_common.wire.models import VNPUInfo
from vnpu_operator.placement import (
    Allocation,
    Ledger,
    NodeInventory,
    NoFit,
    Placement,
    Reason,
    Resources,
)


def ledger_with(*inventories: NodeInventory) -> Ledger:
    return Ledger.rebuild(inventories, ())


def fill(ledger: Ledger, template: str, prefix: str = "p") -> tuple[list[Placement], NoFit]:
    """Places single vNPUs until the first NoFit."""
    placed: list[Placement] = []
    for i in range(64):
        got = ledger.place(request(f"{prefix}{i}", template))
        if isinstance(got, NoFit):
            return placed, got
        placed.append(got)
    raise AssertionError("never ran out of capacity")


@pytest.mark.parametrize(
    ("overrides", "template", "fits", "reason"),
    [
        ({}, "vir05_1c_16g", 4, Reason.INSUFFICIENT_AICORE),
        ({"memory_total_mb": 32 * GB}, "vir05_1c_16g", 2, Reason.INSUFFICIENT_MEMORY),
        ({"aicpu_total": 3}, "vir05_1c_16g", 3, Reason.INSUFFICIENT_AICPU),
        ({"id_range": (100, 101)}, "vir05_1c_16g", 2, Reason.NO_FREE_VNPU_ID),
    ],
)
def test_each_resource_fills_then_denies(
    overrides: dict[str, Any], template: str, fits: int, reason: Reason
) -> None:
    ledger = ledger_with(node("n1", [chip("910B3", 0, **overrides)]))
    placed, nofit = fill(ledger, template)
    assert len(placed) == fits
    assert nofit.reasons == {reason: 1}


def test_media_units_fill_then_deny() -> None:
    # aicpu raised so that media, not AICPU, is what runs out.
    ledger = ledger_with(node("n1", [chip("910B4", 0, aicpu_total=8)]))
    placed, nofit = fill(ledger, "vir10_4c_16g_m")
    assert len(placed) == 1
    assert nofit.primary_reason is Reason.INSUFFICIENT_MEDIA
    # The no-media twin still fits beside it.
    assert isinstance(ledger.place(request("nm", "vir10_3c_16g_nm")), Placement)


@pytest.mark.parametrize(
    ("templates", "then_denied"),
    [
        (["vir05_1c_16g"] * 4, "vir05_1c_16g"),
        (["vir10_3c_32g"] * 2, "vir05_1c_16g"),
        (["vir10_3c_32g", "vir05_1c_16g", "vir05_1c_16g"], "vir05_1c_16g"),
    ],
)
def test_910b3_coexistence(templates: list[str], then_denied: str) -> None:
    ledger = ledger_with(node("n1", "910B3"))
    for i, template in enumerate(templates):
        assert isinstance(ledger.place(request(f"p{i}", template)), Placement)
    assert isinstance(ledger.place(request("extra", then_denied)), NoFit)
    (cap,) = ledger.capacity("n1")
    assert cap.free == Resources(0, 0, 7 - sum(3 if "vir10" in t else 1 for t in templates), 0)


def test_310p3_holds_at_most_seven_vnpus() -> None:
    ledger = ledger_with(node("n1", "310P3"))
    placed, nofit = fill(ledger, "vir01")
    assert len(placed) == 7
    assert nofit.primary_reason is Reason.INSUFFICIENT_AICPU


def test_310p3_after_six_vir01_only_vir01_or_vir02_1c() -> None:
    ledger = ledger_with(node("n1", "310P3"))
    for i in range(6):
        assert isinstance(ledger.place(request(f"p{i}", "vir01")), Placement)
    verdicts = {
        t: isinstance(ledger.place(request(f"try-{t}", t)), Placement)
        for t in ("vir02", "vir04", "vir04_3c")
    }
    assert verdicts == {"vir02": False, "vir04": False, "vir04_3c": False}
    assert isinstance(ledger.place(request("a", "vir02_1c")), Placement)
    ledger.release("uid-a")
    assert isinstance(ledger.place(request("b", "vir01")), Placement)


def test_vnpu_limit_is_the_id_range_size() -> None:
    ledger = ledger_with(node("n1", [chip("310P3", 0, id_range=(100, 102))]))
    placed, nofit = fill(ledger, "vir01")
    assert [p.vnpu_ids for p in placed] == [(100,), (101,), (102,)]
    assert nofit.primary_reason is Reason.NO_FREE_VNPU_ID


def test_ids_are_the_lowest_free_of_the_chip_range() -> None:
    ledger = ledger_with(node("n1", "910B3", n_chips=2))
    first = ledger.place(request("a", "vir10_3c_32g", count=2))
    second = ledger.place(request("b", "vir10_3c_32g"))
    assert isinstance(first, Placement)
    assert isinstance(second, Placement)
    assert [(a.chip, a.vnpu_id) for a in first.allocations] == [(0, 100), (0, 101)]
    assert [(a.chip, a.vnpu_id) for a in second.allocations] == [(1, 116)]
    assert first.visible_devices == "100,101"
    assert first.device_paths == ("/dev/vdavinci100", "/dev/vdavinci101")
    ledger.release("uid-a")
    third = ledger.place(request("c", "vir05_1c_16g"))
    assert isinstance(third, Placement)
    # Binpack fills the used chip 1 first.
    assert third.vnpu_ids == (117,)


def test_orphans_hold_ids_and_capacity() -> None:
    orphaned = chip("910B3", 0, vnpus=[(100, "vir05_1c_16g"), (102, "vir05_1c_16g")])
    ledger = ledger_with(node("n1", [orphaned]))
    placed, nofit = fill(ledger, "vir05_1c_16g")
    assert [p.vnpu_ids for p in placed] == [(101,), (103,)]
    assert nofit.primary_reason is Reason.INSUFFICIENT_AICORE
    (cap,) = ledger.capacity("n1")
    assert (cap.allocated, cap.orphans) == (2, 2)


def test_present_vnpu_of_a_ledger_allocation_counts_once() -> None:
    present = chip("910B3", 0, vnpus=[(100, "vir05_1c_16g")])
    ledger = ledger_with(node("n1", [present]))
    ledger.add_allocation(Allocation("ns/a-0", "n1", 0, "vir05_1c_16g", 100, "uid-a", "a"))
    placed, _ = fill(ledger, "vir05_1c_16g")
    assert len(placed) == 3
    (cap,) = ledger.capacity("n1")
    assert (cap.allocated, cap.orphans) == (4, 0)


def test_present_vnpu_with_other_template_than_its_allocation_counts_twice() -> None:
    # The agent cannot adopt it; until that is sorted out both hold capacity.
    present = chip("910B3", 0, vnpus=[(100, "vir10_3c_32g")])
    ledger = ledger_with(node("n1", [present]))
    ledger.add_allocation(Allocation("ns/a-0", "n1", 0, "vir05_1c_16g", 100, "uid-a", "a"))
    (cap,) = ledger.capacity("n1")
    assert cap.used.aicore == 15
    assert (cap.allocated, cap.orphans) == (1, 1)


def test_ids_are_unique_per_node_across_chips() -> None:
    # A vNPU on chip 1 with an id inside chip 0's range (odd, but possible
    # with a misreported range) still takes that id away from chip 0.
    odd = chip("910B3", 1, vnpus=[(100, "vir05_1c_16g")], id_range=(100, 115))
    ledger = ledger_with(node("n1", [chip("910B3", 0, aicpu_total=7), odd]))
    ledger.add_allocation(Allocation("ns/x-0", "n1", 7, "vir05_1c_16g", 101, "uid-x", "x"))
    got = ledger.place(request("a", "vir05_1c_16g", count=2, uid="uid-a"))
    assert isinstance(got, Placement)
    assert not {100, 101} & set(got.vnpu_ids)


def test_free_fields_of_the_inventory_are_not_trusted() -> None:
    stale = chip("910B3", 0, aicore_free=0, memory_free_mb=0, aicpu_free=0)
    ledger = ledger_with(node("n1", [stale]))
    placed, _ = fill(ledger, "vir05_1c_16g")
    assert len(placed) == 4


def test_unknown_template_of_an_orphan_blocks_its_chip() -> None:
    mystery = chip("910B3", 0, vnpus=[(100, "vir99_9c")])
    ledger = ledger_with(node("n1", [mystery]))
    (cap,) = ledger.capacity("n1")
    assert cap.free == Resources()
    nofit = ledger.place(request("a"))
    assert isinstance(nofit, NoFit)
    assert nofit.primary_reason is Reason.INSUFFICIENT_AICORE


def test_template_missing_on_chip_is_sized_from_same_model_elsewhere() -> None:
    narrow = chip("910B3", 0, templates=["vir10_3c_32g"], vnpus=[(100, "vir05_1c_16g")])
    ledger = ledger_with(node("n1", [narrow]), node("n2", "910B3", live=False))
    (cap,) = ledger.capacity("n1")
    assert cap.used == Resources(5, 16 * GB, 1, 0)
    placed, nofit = fill(ledger, "vir10_3c_32g")
    assert len(placed) == 1
    assert nofit.reasons == {Reason.INSUFFICIENT_AICORE: 1, Reason.NODE_NOT_LIVE: 1}


def test_capacity_reports_every_chip_sorted() -> None:
    ledger = ledger_with(node("b", "310P3", n_chips=2), node("a", "910B3"))
    ledger.place(request("x", "vir02", chip_model="310P3"))
    caps = ledger.capacity()
    assert [(c.node, c.chip, c.model) for c in caps] == [
        ("a", 0, "910B3"),
        ("b", 0, "310P3"),
        ("b", 1, "310P3"),
    ]
    assert caps[1].used == Resources(2, 6 * GB, 2, 0)
    assert caps[1].free == Resources(6, 18 * GB, 5, 1)
    assert caps[1].vnpu_limit == 8
    assert ledger.capacity("nope") == []


def test_vnpu_info_ids_outside_range_do_not_break_placement() -> None:
    weird = chip("910B3", 0)
    weird.vnpus.append(VNPUInfo(id=1123, template="vir05_1c_16g"))
    ledger = ledger_with(node("n1", [weird]))
    placed, _ = fill(ledger, "vir05_1c_16g")
    assert len(placed) == 3


def _fresh(ledger: Ledger) -> Ledger:
    """A ledger rebuilt from what `ledger` holds: nothing cached."""
    nodes = [n for name in ledger.node_names() if (n := ledger.node(name)) is not None]
    return Ledger.rebuild(nodes, ledger.allocations())


def test_kept_capacity_follows_every_change() -> None:
    # The ledger keeps each node's built capacity between placements; after
    # any change it must read as a ledger rebuilt from scratch would.
    ledger = ledger_with(node("n1", n_chips=2), node("n2", n_chips=1))
    assert ledger.capacity() == _fresh(ledger).capacity()
    got = ledger.place(request("a", count=2))
    assert isinstance(got, Placement)
    assert ledger.capacity() == _fresh(ledger).capacity()

    steps = [
        lambda: ledger.add_allocation(
            Allocation("default/x-0", "n2", 0, "vir05_1c_16g", 110, "uid-x", "x")
        ),
        lambda: ledger.remove_allocation(got.allocations[0].key, destroyed=True),
        lambda: ledger.set_live("n1", False),
        lambda: ledger.set_live("n1", True),
        lambda: ledger.upsert_node(node("n2", [chip("910B3", 0, vnpus=[(111, "vir05_1c_16g")])])),
        lambda: ledger.upsert_node(node("n1", n_chips=2, cordoned={1: "maintenance"})),
        lambda: ledger.release("uid-x"),
        lambda: ledger.remove_node("n2"),
    ]
    for step in steps:
        ledger.place(request("probe", uid="probe"))  # fills the kept capacity
        ledger.release("probe")
        step()
        assert ledger.capacity() == _fresh(ledger).capacity()
        assert ledger.fragmentation() == _fresh(ledger).fragmentation()


def test_node_state_is_a_copy() -> None:
    ledger = ledger_with(node("n1"))
    before = ledger.capacity()
    state = ledger.node_state("n1")
    assert state is not None
    state.chips[0].book(Resources(aicore=8))
    state.used_ids.add(100)
    assert ledger.capacity() == before
    assert isinstance(ledger.place(request("a")), Placement)


def test_a_sum_of_resources_is_their_additions_field_by_field() -> None:
    values = [Resources(2, 16 * GB, 1, 0), Resources(4, 32 * GB, 2, 1), Resources(1, 0, 0, 3)]
    total = Resources.sum(values)
    assert total == values[0] + values[1] + values[2]
    assert total == Resources(7, 48 * GB, 3, 4)
    assert Resources.sum([]) == Resources()
    # A generator is read once, as build_node_state and NodeState.usage pass them.
    assert Resources.sum(v for v in values) == total
