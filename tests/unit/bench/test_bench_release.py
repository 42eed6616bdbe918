"""The fill's freed -> placed delay split at the operator's first create."""

from __future__ import annotations

from typing import Any

from bench.release import creates_sent, split

from localplane.policies import OPERATOR_USER
from vnpu_common import names


def create(name: str, at: str, user: str = OPERATOR_USER, resource: str = "") -> dict[str, Any]:
    return {
        "verb": "create",
        "user": {"username": user},
        "objectRef": {"resource": resource or names.ALLOCATION_PLURAL, "name": name},
        "requestReceivedTimestamp": at,
    }


def test_the_first_create_of_each_waiting_pod_counts_on_the_benchmarks_clock() -> None:
    events = [
        create("f-00002-ab12cd34ef-1", "2026-01-01T00:00:10.500000Z"),
        create("f-00002-ab12cd34ef-0", "2026-01-01T00:00:10.250000Z"),
        create("f-00003-ab12cd34ef-0", "2026-01-01T00:00:11Z"),
        # Not the operator's, not an allocation, not a waiting pod: none counts.
        create("f-00004-ab12cd34ef-0", "2026-01-01T00:00:09Z", user="someone"),
        create("f-00004-ab12cd34ef-0", "2026-01-01T00:00:09Z", resource="pods"),
        create("f-00009-ab12cd34ef-0", "2026-01-01T00:00:09Z"),
    ]
    offset = 1767225600.0  # 2026-01-01T00:00:00Z: monotonic 0 then
    got = creates_sent(events, ["f-00002", "f-00003", "f-00004"], offset)
    assert got == {"f-00002": 10.25, "f-00003": 11.0}


def test_the_delay_is_split_pair_by_pair_at_the_creates() -> None:
    freed, sent, taken = [1.0, 2.0, None], [1.5, 4.0, 3.0], [2.0, 4.5, 3.1]
    out = split(freed, sent, taken)
    # Freed 1, 2 against sent 1.5, 3 (sorted): the operator took 0.5 and 1.
    assert out["gone_to_creates_sent"]["max"] == 1.0
    assert out["gone_to_creates_sent"]["n"] == 2
    # Sent 1.5, 3, 4 against placed 2, 3.1, 4.5: the API server 0.5, 0.1, 0.5.
    assert out["creates_sent_to_placed"]["n"] == 3
    assert abs(out["creates_sent_to_placed"]["max"] - 0.5) < 1e-9
