"""Quota charges agree with the ledger: what the ledger places on a node, charged as
the webhook charges it, never exceeds what the operator advertises for that node, so
the scheduler and the kubelet never refuse a pod the operator pinned."""

from __future__ import annotations

import random

import pytest
from placement_helpers import MODELS, chip, node, request

from vnpu_common import names
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
    live: dict[str, Charge] = {}
    for step in range(400):
        if live and rng.random() < 0.3:  # a pod ends
            uid = rng.choice(sorted(live))
            ledger.release(uid)
            gone = live.pop(uid)
            charged = Charge(*(a - b for a, b in zip(_t(charged), _t(gone), strict=True)))
            continue
        template, count = rng.choice(templates), rng.choice((1, 1, 2, 3))
        charge = charge_for(template, count, None, offered)
        assert isinstance(charge, Charge), charge
        placement = ledger.place(request(f"p{step}", template, count), rng.choice(list(Policy)))
        if isinstance(placement, Placement):
            live[f"uid-p{step}"] = charge
            charged = Charge(*(a + b for a, b in zip(_t(charged), _t(charge), strict=True)))
        assert charged.aicore <= totals[names.RES_AICORE]
        assert charged.memory_mb <= totals[names.RES_MEMORY_MB]
        assert charged.vnpus <= totals[names.RES_VNPUS]
    assert live, "the walk never placed anything"


def _t(c: Charge) -> tuple[int, int, int]:
    return (c.aicore, c.memory_mb, c.vnpus)


def test_node_totals_sum_the_chips() -> None:
    inventory = node("n", [chip("910B3", 0), chip("310P3", 1)])
    assert node_totals(inventory) == {
        names.RES_AICORE: 20 + 8,
        names.RES_MEMORY_MB: (64 + 24) * 1024,
        names.RES_VNPUS: 16 + 8,
    }
    assert node_totals(None) == {}


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
