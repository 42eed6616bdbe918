"""Quota charges agree with the ledger: what the ledger places on a node, charged as
the webhook charges it, never exceeds what the operator advertises for that node, so
the scheduler and the kubelet never refuse a pod the operator pinned."""

from __future__ import annotations

import random

import pytest
from placement_helpers import MODELS, chip, node, request

from vnpu_common.wire import names
from vnpu_operator.admission import OfferedTemplates
from vnpu_operator.admission.charges import Charge, charge_for
from vnpu_operator.advertise import node_totals, status_patch
from vnpu_operator.placement import Ledger, Placement, Policy


def _offered(ledger: Ledger) -> OfferedTemplates:
    return OfferedTemplates(ledger.offered(), ledger.template_sizes())


@pytest.mark.parametrize("seed", range(12))
def test_what_the_ledger_places_fits_the_advertised_totals(seed: int) -> None:
    rng = random.Random(seed)
    chips = [chip("910B3", 0), chip("910B3", 1), chip("310P3", 2), chip("910B4", 3)]
    ledger = Ledger()
    ledger.upsert_node(node("n", chips))
    offered = _offered(ledger)
    totals = node_totals(ledger.node("n"))
    templates = sorted({t for m in ("910B3", "310P3", "910B4") for t in MODELS[m][5]})
    charged = Charge(0, 0, 0)
    per_template: dict[str, int] = {}
    live: dict[str, Charge] = {}
    for step in range(400):
        if live and rng.random() < 0.3:  # a pod ends
            uid = rng.choice(sorted(live))
            ledger.release(uid)
            gone = live.pop(uid)
            charged = Charge(*(a - b for a, b in zip(_t(charged), _t(gone), strict=True)))
            per_template[gone.template] -= gone.vnpus
            continue
        template, count = rng.choice(templates), rng.choice((1, 1, 2, 3))
        charge = charge_for(template, count, None, offered)
        assert isinstance(charge, Charge), charge
        placement = ledger.place(request(f"p{step}", template, count), rng.choice(list(Policy)))
        if isinstance(placement, Placement):
            live[f"uid-p{step}"] = charge
            charged = Charge(*(a + b for a, b in zip(_t(charged), _t(charge), strict=True)))
            per_template[template] = per_template.get(template, 0) + charge.vnpus
        assert charged.aicore <= totals[names.RES_AICORE]
        for name, count in per_template.items():
            assert count <= totals[names.template_resource(name)], name
        assert charged.memory_mb <= totals[names.RES_MEMORY_MB]
        assert charged.vnpus <= totals[names.RES_VNPUS]
    assert live, "the walk never placed anything"


def _t(c: Charge) -> tuple[int, int, int]:
    return (c.aicore, c.memory_mb, c.vnpus)


def test_node_totals_sum_the_chips() -> None:
    inventory = node("n", [chip("910B3", 0), chip("310P3", 1)])
    sums = {
        names.RES_AICORE: 20 + 8,
        names.RES_MEMORY_MB: (64 + 24) * 1024,
        names.RES_VNPUS: 16 + 8,
    }
    # Per template, what the empty chips hold: 910B3 4 x vir05_1c_16g or 2 x
    # vir10_3c_32g; 310P3 (7 AICPU, 8 ids) 7 x vir01, 4 x vir02 (8 AICore), ...
    per_template = {
        names.template_resource(t): n
        for t, n in {
            "vir05_1c_16g": 4,
            "vir10_3c_32g": 2,
            "vir01": 7,
            "vir02": 3,
            "vir02_1c": 4,
            "vir04": 1,
            "vir04_3c": 2,
            "vir04_3c_ndvpp": 2,
            "vir04_4c_dvpp": 1,
        }.items()
    }
    assert node_totals(inventory) == {**sums, **per_template}
    assert node_totals(None) == {}


def test_a_dra_node_lists_no_template_resource() -> None:
    """KEP-5004: the scheduler serves vnpu.io/<template> from a node's ResourceSlices
    only while its capacity does not list the name; one name is never offered both ways."""
    inventory = node("n", [chip("910B3", 0)])
    inventory.status.dra = True
    totals = node_totals(inventory)
    assert not [k for k in totals if names.template_of_resource(k) is not None]
    stale = {"status": {"capacity": {names.template_resource("vir05_1c_16g"): "4"}}}
    patch = status_patch(totals, stale)
    assert patch is not None
    assert patch["status"]["capacity"][names.template_resource("vir05_1c_16g")] is None


def test_the_status_patch_sets_what_differs_and_removes_what_is_not_ours_to_keep() -> None:
    want = {names.RES_AICORE: 16000, names.RES_VNPUS: 8}
    node_obj = {
        "status": {
            "capacity": {names.RES_AICORE: "16k", "vnpu.io/stale": "3", "cpu": "4"},
            "allocatable": {names.RES_AICORE: "0", names.RES_VNPUS: "8"},
        }
    }
    assert status_patch(want, node_obj) == {
        "status": {
            "capacity": {names.RES_VNPUS: "8", "vnpu.io/stale": None},
            "allocatable": {names.RES_AICORE: "16000"},
        }
    }
    applied = {
        "status": {
            "capacity": {names.RES_AICORE: "16k", names.RES_VNPUS: "8", "cpu": "4"},
            "allocatable": {names.RES_AICORE: "16000", names.RES_VNPUS: "8"},
        }
    }
    assert status_patch(want, applied) is None
    # A node whose VNPUNode is gone loses our resources and keeps the rest.
    assert status_patch({}, applied) == {
        "status": {
            "capacity": {names.RES_AICORE: None, names.RES_VNPUS: None},
            "allocatable": {names.RES_AICORE: None, names.RES_VNPUS: None},
        }
    }
    assert status_patch({}, {"metadata": {"name": "plain"}}) is None
