"""`python -m bench.placement.churn`: a request shape's first placement asks
one node of each class of nodes alike in what the answer reads, and computes
one fit for them; after that a placement asks the same few nodes at any size."""

from __future__ import annotations

from bench.placement.churn import churn


def test_a_short_churn_asks_as_many_nodes_per_pod_at_any_size() -> None:
    small, large = churn(20, 60), churn(80, 60)
    # 60 more nodes, all alike the 20: no more asked, no more fits computed.
    assert large["asks_per_pod"] == small["asks_per_pod"], (small, large)
    assert large["fits_per_pod"] <= small["fits_per_pod"], (small, large)
    assert small["asks_per_pod"] < 4, small


def test_a_long_churn_asks_as_few_nodes_per_pod_at_any_size() -> None:
    small, large = churn(20, 1200), churn(80, 1200)
    assert large["asks_per_pod"] - small["asks_per_pod"] < 0.5, (small, large)
    assert small["asks_per_pod"] < 4, small
