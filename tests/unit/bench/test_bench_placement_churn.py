"""`python -m bench.placement.churn`: a request shape's first placement asks
every node once, but computes one fit for all nodes alike; after that a
placement asks the same few nodes at any size."""

from __future__ import annotations

from bench.load import MIX
from bench.placement.churn import churn


def test_a_short_churn_asks_each_node_once_per_shape_and_fits_alike_nodes_once() -> None:
    small, large = churn(20, 60), churn(80, 60)
    shapes = len({(template, count) for template, count, _ in MIX})
    # 60 more nodes asked once by each shape, spread over 60 pods.
    extra = large["asks_per_pod"] - small["asks_per_pod"]
    assert abs(extra - shapes * 60 / 60) < 0.5, (small, large)
    # The 60 more nodes are alike: no more fits are computed.
    assert large["fits_per_pod"] <= small["fits_per_pod"], (small, large)
    assert large["fits_per_pod"] < small["asks_per_pod"], (small, large)


def test_a_long_churn_asks_as_few_nodes_per_pod_at_any_size() -> None:
    small, large = churn(20, 1200), churn(80, 1200)
    # Only the once-per-shape asks differ: 6 shapes x 60 nodes / 1200 pods.
    assert large["asks_per_pod"] - small["asks_per_pod"] < 0.5, (small, large)
    assert small["asks_per_pod"] < 4, small
