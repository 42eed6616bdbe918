"""The policy-cost benchmark's arithmetic: medians per mode, cost and share."""

from __future__ import annotations

from typing import Any

import pytest
from bench.policycost import WITH, WITHOUT, main, summary


def row(mode: str, ms: float) -> dict[str, Any]:
    return {"policies": mode, "apiserver_ms_per_pod": ms}


def test_cost_is_the_difference_of_the_medians() -> None:
    # An outlier round in either mode moves a mean, not the median.
    rows = [row(WITH, 36.0), row(WITH, 35.0), row(WITH, 90.0),
            row(WITHOUT, 33.0), row(WITHOUT, 32.0), row(WITHOUT, 10.0)]  # fmt: skip
    s = summary(rows)
    assert s["apiserver_ms_per_pod_median"] == {WITH: 36.0, WITHOUT: 32.0}
    assert s["policy_cost_ms_per_pod"] == pytest.approx(4.0)
    assert s["policy_cost_share"] == pytest.approx(4.0 / 32.0)
    assert s["spread_ms_per_pod"] == {WITH: (35.0, 90.0), WITHOUT: (10.0, 33.0)}


def test_a_cheaper_with_round_shows_as_a_negative_cost() -> None:
    s = summary([row(WITH, 30.0), row(WITHOUT, 31.0)])
    assert s["policy_cost_ms_per_pod"] == pytest.approx(-1.0)


def test_one_mode_missing_gives_no_cost() -> None:
    s = summary([row(WITH, 30.0)])
    assert s["policy_cost_ms_per_pod"] is None
    assert s["policy_cost_share"] is None


@pytest.mark.parametrize(
    "argv", [["--rounds", "0"], ["--pods", "0"], ["--warmup", "-1"], ["--rate", "0"]]
)
def test_bad_arguments_are_refused_before_any_plane_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "must be at least" in capsys.readouterr().err
