"""The fill's freed -> placed delay split at the operator's first create."""

from __future__ import annotations

from typing import Any

from bench.release import committed, creates_sent, split

from localplane.policies import AGENT_USER, OPERATOR_USER
from vnpu_common.wire import names


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


def served(verb: str, name: str, at: str, user: str, **extra: Any) -> dict[str, Any]:
    return {
        "verb": verb,
        "user": {"username": user},
        "objectRef": {"resource": names.ALLOCATION_PLURAL, "name": name, **extra},
        "stageTimestamp": at,
        "responseStatus": {"code": 200},
    }


def test_freed_and_placed_are_when_the_api_server_served_the_last_write() -> None:
    events = [
        # f-00000's two allocations released by its agent at 10.2 and 10.7.
        served("patch", "f-00000-aa-0", "2026-01-01T00:00:10.200000Z", AGENT_USER),
        served("patch", "f-00000-aa-1", "2026-01-01T00:00:10.700000Z", AGENT_USER),
        # A status patch is not the release, nor is an operator's patch.
        served("patch", "f-00000-aa-1", "2026-01-01T00:00:12Z", AGENT_USER, subresource="status"),
        served("patch", "f-00000-aa-1", "2026-01-01T00:00:13Z", OPERATOR_USER),
        # f-00001: one of two released: its capacity was not all freed.
        served("patch", "f-00001-aa-0", "2026-01-01T00:00:10Z", AGENT_USER),
        # The waiting pod's two creates served at 11 and 11.4; a refused one
        # (409) is not a placement.
        served("create", "f-00009-bb-0", "2026-01-01T00:00:11Z", OPERATOR_USER),
        served("create", "f-00009-bb-1", "2026-01-01T00:00:11.400000Z", OPERATOR_USER),
        {**served("create", "f-00008-bb-0", "2026-01-01T00:00:11Z", OPERATOR_USER),
         "responseStatus": {"code": 409}},
        served("create", "f-00008-bb-1", "2026-01-01T00:00:11Z", OPERATOR_USER),
    ]  # fmt: skip
    offset = 1767225600.0
    freed, placed = committed(events, ["f-00000", "f-00001"], ["f-00008", "f-00009"], 2, offset)
    assert list(freed) == ["f-00000"]
    assert abs(freed["f-00000"] - 10.7) < 1e-6
    assert list(placed) == ["f-00009"]
    assert abs(placed["f-00009"] - 11.4) < 1e-6
