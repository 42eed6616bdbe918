"""bestfit keeps room for the largest templates and never breaks a chip
limit. Limits are checked against an independent model of the chips
(test_placement_property's), over random streams of place and release."""

from __future__ import annotations

import random

from placement_helpers import MODELS, chip, node, placed, request
from test_placement_property import check_invariants

from vnpu_operator.placement import Ledger, NodeInventory, Placement, Policy

VIR05, VIR10 = "vir05_1c_16g", "vir10_3c_32g"


def test_random_streams_never_break_a_chip_limit() -> None:
    inventories = {
        inv.name: inv
        for inv in [
            node("a", [chip("910B3", 0), chip("910B3", 1), chip("310P3", 2)]),
            node("b", [chip("910B4", 0), chip("310P3", 1, id_range=(100, 103))]),
            node("c", [chip("310P3", 0), chip("310P3", 1), chip("910B3", 2)]),
        ]
    }
    for seed in range(6):
        rng = random.Random(seed)
        ledger = Ledger.rebuild(inventories.values(), ())
        held: list[str] = []
        placements = 0
        for step in range(400):
            if held and rng.random() < 0.4:
                ledger.release(held.pop(rng.randrange(len(held))))
            else:
                model = rng.choice(sorted(MODELS))
                req = request(
                    f"p{step}", rng.choice(sorted(MODELS[model][5])), rng.choice([1, 1, 2, 3])
                )
                result = ledger.place(req, Policy.BESTFIT)
                if isinstance(result, Placement):
                    held.append(req.uid)
                    placements += 1
            check_invariants(ledger, inventories)
        assert placements > 100, f"seed {seed}: the cluster was never busy enough to prove much"


def test_small_vnpus_go_where_a_large_one_would_not_fit_anyway() -> None:
    # Chip 0 holds a vir10 (10 of 20 AICore free: one more vir10 fits);
    # chip 1 holds three vir05 (5 free: no vir10 fits). binpack by usage
    # takes chip 1 as well here, but bestfit must on every node order:
    # a vir05 on chip 0 would cost the last vir10 the node can take.
    inv = node(
        "n",
        [
            chip("910B3", 0, vnpus=[(100, VIR10)]),
            chip("910B3", 1, vnpus=[(116, VIR05), (117, VIR05), (118, VIR05)]),
            chip("910B3", 2, vnpus=[(132, VIR05), (133, VIR05)]),
        ],
    )
    ledger = Ledger.rebuild([inv], ())
    (alloc,) = placed(ledger.place(request("small", VIR05), Policy.BESTFIT)).allocations
    assert alloc.chip == 1
    # Then a vir10 still fits on chips 0 and 2.
    assert len(placed(ledger.place(request("big", VIR10, 2), Policy.BESTFIT)).allocations) == 2


def test_a_wholly_free_chip_stays_whole_while_a_used_one_fits() -> None:
    # Both chips take a vir05 without losing a vir10 (20 free on the empty
    # chip: 2 -> 1 is a loss; 15 free: 1 -> 1 is not): the used chip wins.
    inv = node("n", [chip("910B3", 0), chip("910B3", 1, vnpus=[(116, VIR05)])])
    ledger = Ledger.rebuild([inv], ())
    (alloc,) = placed(ledger.place(request("small", VIR05), Policy.BESTFIT)).allocations
    assert alloc.chip == 1


def test_on_310p3_the_aicpu_decides_not_the_aicore() -> None:
    # A 310P3 has 7 AICPU and 8 AICore. Chip 0 holds a vir04 (4 AICPU):
    # 3 AICPU left, so no second vir04 fits there. Chip 1 holds two vir02_1c
    # (2 AICPU): a vir04 still fits. A vir02 (2 AICPU) on chip 1 would cost
    # that vir04, so it goes to chip 0, and the vir04 still finds room.
    inv = node(
        "n",
        [
            chip("310P3", 0, vnpus=[(100, "vir04")]),
            chip("310P3", 1, vnpus=[(116, "vir02_1c"), (117, "vir02_1c")]),
        ],
    )
    ledger = Ledger.rebuild([inv], ())
    (alloc,) = placed(ledger.place(request("v2", "vir02"), Policy.BESTFIT)).allocations
    assert alloc.chip == 0
    assert len(placed(ledger.place(request("v4", "vir04"), Policy.BESTFIT)).allocations) == 1


def test_node_choice_keeps_a_whole_node_for_the_largest() -> None:
    nodes: list[NodeInventory] = [
        node("empty", "910B3", n_chips=2),
        node("used", [chip("910B3", 0, vnpus=[(100, VIR05)]), chip("910B3", 1)]),
    ]
    ledger = Ledger.rebuild(nodes, ())
    assert placed(ledger.place(request("small", VIR05), Policy.BESTFIT)).node == "used"
    # The empty node still takes 4 x vir10 in one pod.
    assert placed(ledger.place(request("big", VIR10, 4), Policy.BESTFIT)).node == "empty"
