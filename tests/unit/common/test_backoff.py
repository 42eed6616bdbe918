import pytest

from vnpu_common.kube.backoff import Backoff


def test_doubles_from_base_up_to_the_cap() -> None:
    b = Backoff(base=0.5, cap=4.0, jitter=0.0)
    assert [b.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_jitter_only_shortens_and_stays_within_its_fraction() -> None:
    b = Backoff(base=1.0, cap=8.0, jitter=0.25)
    assert b.delay(4, rand=lambda: 0.0) == 8.0
    assert b.delay(4, rand=lambda: 1.0) == 6.0
    assert b.delay(50, rand=lambda: 0.5) == 7.0  # huge failure counts stay capped


def test_a_cap_below_the_base_is_the_ceiling() -> None:
    assert Backoff(base=0.25, cap=0.01, jitter=0.0).delay(1) == 0.01


def test_zero_or_negative_failures_count_as_the_first() -> None:
    b = Backoff(base=0.25, cap=1.0, jitter=0.0)
    assert b.delay(0) == b.delay(-3) == b.delay(1) == 0.25


@pytest.mark.parametrize("kwargs", [{"base": 0}, {"cap": 0}, {"jitter": 1.0}, {"jitter": -0.1}])
def test_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="invalid backoff"):
        Backoff(**kwargs)
