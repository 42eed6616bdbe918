"""The machine's own time through a phase: busy, idle and stolen by the
hypervisor, read from /proc/stat, and the report's churn rows from it."""

from __future__ import annotations

import pytest
from bench.cluster import CLK_TCK, MachineCpu, machine_cpu
from bench.report import churn_machine_rows
from bench.run import machine_share

STAT = (
    "cpu  7054298 2988 788892 9754654 9974 0 103561 49491 0 0\n"
    "cpu0 3527149 1494 394446 4877327 4987 0 51780 24745 0 0\n"
)


def test_machine_cpu_reads_the_first_line_into_busy_idle_and_steal() -> None:
    m = machine_cpu(STAT)
    assert m.busy == pytest.approx((7054298 + 2988 + 788892 + 0 + 103561) / CLK_TCK)
    assert m.idle == pytest.approx((9754654 + 9974) / CLK_TCK)
    assert m.steal == pytest.approx(49491 / CLK_TCK)


def test_machine_cpu_reads_this_machine() -> None:
    a = machine_cpu()
    b = machine_cpu()
    assert a.busy + a.idle > 0
    assert b.busy >= a.busy
    assert b.idle >= a.idle
    assert b.steal >= a.steal


def test_machine_share_splits_the_window_between_busy_idle_and_steal() -> None:
    share = machine_share(MachineCpu(10.0, 50.0, 1.0), MachineCpu(16.0, 52.0, 3.0))
    assert share == pytest.approx({"busy": 0.6, "idle": 0.2, "steal": 0.2})
    assert machine_share(MachineCpu(1, 1, 1), MachineCpu(1, 1, 1)) == {
        "busy": 0.0, "idle": 0.0, "steal": 0.0,
    }  # fmt: skip


def test_churn_machine_rows_put_ours_beside_the_floor() -> None:
    r = {
        "config": {"pods": 1000},
        "churn": {"machine": {"busy": 0.78, "idle": 0.2, "steal": 0.02},
                  "cpu_seconds": {"kube-apiserver": 110.3}},
        "floor": {"churn": {"machine": {"busy": 0.7, "idle": 0.3, "steal": 0.0},
                            "cpu_seconds": {"kube-apiserver": 60.5}}},
    }  # fmt: skip
    assert churn_machine_rows(r) == [
        ("  the churn's machine, ours / floor",
         "cores busy 78.0% / 70.0%, stolen 2.0% / 0.0%"),
        ("  API server CPU ms per pod in the churn, ours / floor", "110.3 / 60.5"),
    ]  # fmt: skip


def test_churn_machine_rows_need_both_churns() -> None:
    ours = {"machine": {"busy": 0.78, "idle": 0.2, "steal": 0.02}}
    assert churn_machine_rows({"churn": ours}) == []
    assert churn_machine_rows({"churn": {}, "floor": {"churn": ours}}) == []
