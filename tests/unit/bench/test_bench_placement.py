"""A short run of the placement-quality benchmark (bench/placement) on its
fixed seeds: bestfit never does worse than first-fit, no online policy beats
the offline best, and bad inputs are refused with a clear message."""

from __future__ import annotations

import pytest
from bench.cluster import CHIPS
from bench.placement import offline, simulate, workload
from bench.placement.__main__ import SMALL_CHIPS, main

from vnpu_operator.placement import Policy

NODES, ARRIVALS = 20, 1500


@pytest.mark.parametrize("load", [0.85, 0.95])
def test_bestfit_never_does_worse_than_firstfit(load: float) -> None:
    stream = workload.stream(load, NODES, ARRIVALS, seed=17)
    outcomes = {
        policy: simulate.run(policy, workload.inventories(NODES), stream, warmup=ARRIVALS // 3)
        for policy in (Policy.FIRSTFIT, Policy.BESTFIT)
    }
    first, best = outcomes[Policy.FIRSTFIT], outcomes[Policy.BESTFIT]
    assert first.requests == best.requests == ARRIVALS - ARRIVALS // 3
    # The load must make first-fit miss, or the comparison proves nothing.
    assert first.placed_now < first.requests
    assert best.placed_now >= first.placed_now
    assert best.large_placed_now >= first.large_placed_now


def test_no_policy_beats_the_offline_best() -> None:
    for seed in (17, 18, 19):
        stream = workload.stream(2.0, 1, 10, seed, chips=SMALL_CHIPS)
        limit = offline.best(stream, 1, SMALL_CHIPS)
        assert limit <= len(stream)
        for policy in Policy:
            inventories = workload.inventories(1, SMALL_CHIPS)
            placed = simulate.run(policy, inventories, stream, waiting=False).placed_now
            assert placed <= limit, (seed, policy)


def test_offline_best_refuses_a_large_request_to_place_more_small_ones() -> None:
    # One 910B3 chip: a pod of two vir10 fills it, then four vir05 arrive
    # while it lives. Every online policy places the pair (it fits) and so
    # loses the four; the best refuses the pair.
    long = 10.0
    pair_then_smalls = [
        workload.Arrival(0, 0.0, long, "vir10_3c_32g", 2, "910B3", True, 20),
        *(
            workload.Arrival(i, float(i), long, "vir05_1c_16g", 1, "910B3", False, 5)
            for i in range(1, 5)
        ),
    ]
    assert offline.best(pair_then_smalls, 1, {"910B3": 1}) == 4
    for policy in Policy:
        inventories = workload.inventories(1, {"910B3": 1})
        online = simulate.run(policy, inventories, pair_then_smalls, waiting=False)
        assert online.placed_now == 1


def test_the_stream_is_fixed_by_its_seed_and_offers_the_asked_load() -> None:
    one = workload.stream(0.9, NODES, 4000, seed=3)
    assert one == workload.stream(0.9, NODES, 4000, seed=3)
    assert one != workload.stream(0.9, NODES, 4000, seed=4)
    # Mean size alive = rate x mean lifetime x mean size; over chips it is the load.
    span = one[-1].at - one[0].at
    sizes = sum(
        workload.size(workload.model_of(a.template, CHIPS), a.template, a.count) for a in one
    )
    chips = NODES * sum(CHIPS.values())
    assert sizes / span / chips == pytest.approx(0.9, rel=0.1)


def test_bad_inputs_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="offered load must be positive"):
        workload.stream(0, NODES, 10, seed=1)
    with pytest.raises(ValueError, match="offers vir99"):
        workload.model_of("vir99", CHIPS)
    for argv in (["--loads", "high"], ["--loads", "0"], ["--nodes", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    assert "--loads" in capsys.readouterr().err
