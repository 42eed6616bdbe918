"""The sustainable-rate search (bench/rates.py): ramp, bracket, bisect, stop."""

from __future__ import annotations

from bench.rates import Search, Step


def run(search: Search, capacity: float, max_steps: int = 30) -> tuple[float | None, list[Step]]:
    """Drives the search against a system that keeps p99 within the limit
    up to `capacity` pods/s."""
    steps: list[Step] = []
    while (rate := search.next_rate(steps)) is not None and len(steps) < max_steps:
        p99 = 0.2 if rate <= capacity else 3.0
        steps.append(Step(rate, p99))
    return search.best(steps), steps


def test_a_step_passes_only_with_every_pod_within_the_limit() -> None:
    assert Step(10, 0.9).ok(1.0)
    assert not Step(10, 1.1).ok(1.0)
    assert not Step(10, 0.5, missing=1).ok(1.0)
    assert not Step(10, None).ok(1.0)


def test_finds_the_capacity_within_the_resolution() -> None:
    search = Search(start=20, resolution=1.25)
    best, steps = run(search, capacity=57)
    assert best is not None
    assert best <= 57
    fails = [s.rate for s in steps if not s.ok(1.0)]
    assert min(fails) / best <= 1.25
    assert [s.rate for s in steps[:3]] == [20, 40, 80]  # doubling until the first failure


def test_ramps_down_when_the_start_fails() -> None:
    best, steps = run(Search(start=20), capacity=3)
    assert best is not None
    assert best <= 3
    assert steps[1].rate == 10  # halved after the failing start


def test_gives_up_below_the_minimum() -> None:
    search = Search(start=4, min_rate=1)
    best, steps = run(search, capacity=0.1)
    assert best is None
    assert [s.rate for s in steps] == [4, 2, 1]
    assert "no rate" in search.done_reason(steps)


def test_stops_at_the_maximum_when_everything_passes() -> None:
    search = Search(start=25, max_rate=100)
    best, steps = run(search, capacity=1000)
    assert best == 100
    assert [s.rate for s in steps] == [25, 50, 100]
    assert "every rate" in search.done_reason(steps)


def test_a_pass_above_a_failure_is_not_the_best() -> None:
    # A loaded machine can fail 40/s and then pass 60/s: the lowest failure bounds the answer.
    search = Search(start=20)
    steps = [Step(20, 0.3), Step(40, 2.0), Step(60, 0.4)]
    assert search.best(steps) == 20
    nxt = search.next_rate(steps)
    assert nxt is not None
    assert 20 < nxt < 40
