"""Watch-stream tallies (bench/watchcount.py): events and bytes per component."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from bench.watchcount import MANAGED_PODS, Tally, WatchSpec, component_watches, per_pod

from vnpu_common.wire import names
from vnpu_operator.watches import pod_informer


def line(kind: str, obj: dict[str, object]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def test_counts_events_by_type_and_every_byte_bookmarks_apart() -> None:
    t = Tally()
    lines = [
        line("ADDED", {"metadata": {"name": "a"}}),
        line("MODIFIED", {"metadata": {"name": "a"}, "spec": {"x": "y" * 100}}),
        line("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),
        b"\n",
        line("DELETED", {"metadata": {"name": "a"}}),
    ]
    for raw in lines:
        t.line(raw)
    assert t.events == 3
    assert t.bookmarks == 1
    assert t.by_type == {"ADDED": 1, "MODIFIED": 1, "DELETED": 1}
    assert t.nbytes == sum(len(x) for x in lines if x.strip())


def test_the_operator_watches_four_kinds_its_pods_by_label_and_each_agent_its_nodes() -> None:
    specs = component_watches([["n1", "n2"], ["n3"]])
    operator = [s for s in specs if s.component == "operator"]
    agents = [s for s in specs if s.component == "agent"]
    assert {s.kind for s in operator} == {"pods", "nodes", names.ALLOCATION_PLURAL,
                                          names.NODE_PLURAL}  # fmt: skip
    # Only the pods the webhook labelled, as the operator's pod informer selects.
    assert {s.kind: s.selector for s in operator} == {
        "pods": f"{names.LABEL_MANAGED}=true", "nodes": "", names.ALLOCATION_PLURAL: "",
        names.NODE_PLURAL: "",
    }  # fmt: skip
    assert len(agents) == 4
    assert {s.selector for s in agents} == {f"{names.LABEL_NODE} in (n1,n2)",
                                            f"{names.LABEL_NODE}=n3"}  # fmt: skip


def test_per_pod_sums_the_agents_and_splits_by_kind() -> None:
    a, b, c = Tally(events=10, nbytes=1000), Tally(events=6, nbytes=600), Tally(events=4)
    out = per_pod(
        [
            (WatchSpec("agent", "vnpuallocations", "x"), a),
            (WatchSpec("agent", "vnpuallocations", "y"), b),
            (WatchSpec("operator", "pods"), c),
        ],
        pods=2,
    )
    assert out["agent"]["events"] == 8
    assert out["agent"]["bytes"] == 800
    assert out["agent"]["by_kind"]["vnpuallocations"]["events"] == 8
    assert out["operator"]["events"] == 2


def test_the_operator_pod_watch_selector_is_the_one_its_informer_lists_with() -> None:
    settings: Any = SimpleNamespace(watch_timeout_seconds=60, retry_max_seconds=1)
    stub: Any = SimpleNamespace(listed=print)
    informer = pod_informer(stub, stub, settings)
    assert informer._selector == {"label_selector": MANAGED_PODS}
