"""The controller's side of preemption, with a fake API: the order of its
writes (dry runs, the claim, the evictions, what everyone is told), budget
refusals and their backoff, and a claim rebuilt after a restart."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import generate_latest
from test_controller import FakeApi, World, pod

from vnpu_common.wire import names
from vnpu_operator.config import OperatorSettings
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.placement import Reason
from vnpu_operator.steps import preempt
from vnpu_operator.steps.preempt import foreign_nomination, restorable_claim
from vnpu_operator.wiring import build_pods

BUDGET = "Cannot evict pod as it would violate the pod's disruption budget"


class EvictingApi(FakeApi):
    def __init__(self) -> None:
        super().__init__()
        # pod name -> what a budget says, on dry runs and real evictions alike
        # (`refuse`) or on real ones only (`refuse_late`).
        self.refuse: dict[str, str] = {}
        self.refuse_late: dict[str, str] = {}
        self.gone: set[str] = set()  # pods the API server no longer has

    async def evict_pod(self, target: dict[str, Any], *, dry_run: bool = False) -> str | None:
        name = target["metadata"]["name"]
        self._record("evict_dry" if dry_run else "evict", name)
        return self.refuse.get(name) or (None if dry_run else self.refuse_late.get(name))

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        self._record("patch_node_status", name)

    async def set_nominated_node(self, target: dict[str, Any], node: str | None) -> bool:
        self._record("nominate", (target["metadata"]["name"], node))
        return target["metadata"]["name"] not in self.gone


class Cluster(World):
    """One node of one 910B3 chip (four vNPUs of the default template)."""

    def __init__(self, **settings: Any) -> None:
        self.api = EvictingApi()
        self.now = self.clock = 1000.0
        self.controller = build_pods(
            cast(OperatorApi, self.api),
            OperatorSettings(**{"preemption": True, **settings}),
            OperatorMetrics(),
            clock=lambda: self.clock,
            wall=lambda: self.now,
        ).controller
        self.add_node("n1")

    async def fill(self) -> None:
        """Four running pods of priority 0: low0..low3."""
        self.controller.mark_synced()
        for i in range(4):
            self.controller.pod_event("ADDED", prio(pod(f"low{i}", f"l{i}"), 0))
        await self.settle()
        self.echo_created(names.PHASE_READY)
        await self.settle()
        for i in range(4):
            self.controller.pod_event("MODIFIED", started(pod(f"low{i}", f"l{i}")))
        await self.settle()
        self.api.calls.clear()

    async def high(self, **spec: Any) -> None:
        self.controller.pod_event("ADDED", prio(pod("high", "h"), 1000, **spec))
        await self.settle()

    def metrics(self) -> str:
        return generate_latest(self.controller.metrics.registry).decode()

    def calls(self) -> list[tuple[str, Any]]:
        """What was written, without the Nodes' advertised totals."""
        return [
            (n, a[1] if n == "set_pod_condition" else a[0] if n == "event" else a)
            for n, a in self.api.calls
            if n != "patch_node_status"
        ]


def prio(p: dict[str, Any], priority: int, **spec: Any) -> dict[str, Any]:
    p["spec"].update(priority=priority, **spec)
    return p


def started(p: dict[str, Any]) -> dict[str, Any]:
    p["spec"].pop("schedulingGates")
    p["spec"]["nodeName"] = "n1"
    p["spec"]["priority"] = 0
    p["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] = "100"
    p["status"] = {"phase": "Running"}
    return p


async def test_dry_runs_then_the_claim_then_the_eviction_then_the_words() -> None:
    w = Cluster()
    await w.fill()
    await w.high()
    assert w.calls() == [
        ("evict_dry", "low3"),
        ("nominate", ("high", "n1")),
        ("evict", "low3"),
        ("event", names.REASON_PREEMPTED),
        ("set_pod_condition", names.REASON_PREEMPTING),
        ("event", names.REASON_PREEMPTING),
    ]
    claim = w.controller.ledger.nomination("h")
    assert claim is not None
    assert (claim.node, claim.victims) == ("n1", frozenset({"l3"}))
    # Told again (its own events, capacity changes): no second eviction.
    w.controller.pod_event("MODIFIED", prio(pod("high", "h"), 1000))
    await w.settle()
    assert [n for n, _ in w.calls()].count("evict") == 1

    # A third pod of low priority waits behind the claim.
    w.controller.pod_event("ADDED", prio(pod("third", "t"), 0))
    await w.settle()
    (*_, (_, reason, message)) = w.api.of("set_pod_condition")
    assert reason == names.REASON_WAITING
    assert Reason.NOMINATED.label in message

    # The victim's vNPU goes: the preemptor is placed, its claim and status cleared.
    w.controller.pod_event("MODIFIED", {**started(pod("low3", "l3")), "metadata": {
        **pod("low3", "l3")["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z",
        "deletionGracePeriodSeconds": 0}})  # fmt: skip
    await w.settle()
    (key,) = w.controller.allocs_by_pod["l3"]
    victim_alloc = w.controller.allocs[key]
    w.controller.allocation_gone({**victim_alloc, "metadata": {
        **victim_alloc["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}})  # fmt: skip
    await w.settle()
    assert w.created()[-1]["spec"]["podUID"] == "h"
    assert w.controller.ledger.nominations() == {}
    assert ("nominate", ("high", None)) in w.calls()
    assert not any(b["spec"]["podUID"] == "t" for b in w.created())


async def test_a_refused_victim_makes_the_next_plan_and_all_refused_evicts_nobody() -> None:
    w = Cluster()
    await w.fill()
    w.api.refuse = {"low3": BUDGET}
    await w.high()
    assert [c for c in w.calls() if c[0].startswith("evict")] == [
        ("evict_dry", "low3"),
        ("evict_dry", "low2"),
        ("evict", "low2"),
    ]

    w = Cluster()
    await w.fill()
    w.api.refuse = {f"low{i}": BUDGET for i in range(4)}
    await w.high()
    assert [n for n, _ in w.calls()] == [
        *["evict_dry"] * 4,
        "set_pod_condition",
        "event",
    ]
    (_, reason, message) = w.api.of("set_pod_condition")[-1]
    assert reason == names.REASON_PREEMPTION_BLOCKED
    assert "preemption would evict ns/low0 (Cannot evict pod" in message
    assert "trying again in 5s" in message
    assert w.controller.ledger.nominations() == {}

    # Within the backoff nothing is asked again, whatever happens to the pod.
    w.api.calls.clear()
    w.controller.pod_event("MODIFIED", prio(pod("high", "h"), 1000))
    await w.settle()
    assert w.api.calls == []
    # After it: asked again; refused again, the next wait is twice as long.
    w.clock += 5
    w.controller.kick("h")
    await w.settle()
    assert [n for n, _ in w.calls()].count("evict_dry") == 4
    assert "trying again in 10s" in w.api.of("set_pod_condition")[-1][2]
    # The budget lets go: the next try evicts.
    w.api.refuse.clear()
    w.clock += 10
    w.controller.kick("h")
    await w.settle()
    assert ("evict", "low3") in w.calls()
    assert w.controller.ledger.nomination("h") is not None


async def test_a_backoff_timer_that_fires_early_is_armed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvloop fires a timer up to about a millisecond before time.monotonic()
    says it is due (it counts whole milliseconds): the kick finds the pod
    still inside its backoff. The pod must not then wait for a capacity
    change that may never come (the CI failure of test_preemption's budget
    test): a timer is armed again for what is left."""
    monkeypatch.setattr(preempt, "RETRY_BASE_SECONDS", 0.02)
    w = Cluster()
    await w.fill()
    w.api.refuse = {f"low{i}": BUDGET for i in range(4)}
    await w.high()
    assert [n for n, _ in w.calls()].count("evict_dry") == 4
    # The loop's timer fires; the operator's clock has not reached the end
    # of the backoff yet (w.clock stands still): nothing is asked.
    await asyncio.sleep(0.1)
    await w.settle()
    assert [n for n, _ in w.calls()].count("evict_dry") == 4
    # Time passes, nothing else happens (no event, no capacity change, no
    # hand kick): the pod is asked about again on its own.
    w.api.refuse.clear()
    w.clock += 0.02
    await asyncio.sleep(0.1)
    await w.settle()
    assert ("evict", "low3") in w.calls()


async def test_a_refusal_after_the_dry_run_drops_the_claim() -> None:
    w = Cluster()
    await w.fill()
    w.api.refuse_late = {"low3": BUDGET}
    await w.high()
    names_ = [n for n, _ in w.calls()]
    assert names_[:3] == ["evict_dry", "nominate", "evict"]
    assert ("nominate", ("high", None)) in w.calls()
    assert w.controller.ledger.nominations() == {}
    assert w.api.of("set_pod_condition")[-1][1] == names.REASON_PREEMPTION_BLOCKED


async def test_a_failed_eviction_call_waits_out_a_backoff_never_a_loop() -> None:
    w = Cluster()
    await w.fill()
    w.api.fail["evict_dry"] = ApiException(status=403, reason="Forbidden")
    await w.high()
    # Told it waits, as any pod; nothing claimed, nobody evicted.
    assert w.calls() == [
        ("evict_dry", "low3"),
        ("set_pod_condition", names.REASON_WAITING),
        ("event", names.REASON_WAITING),
    ]
    assert w.controller.ledger.nominations() == {}
    assert 'preemption_attempts_total{result="failed"} 1.0' in w.metrics()
    w.controller.pod_event("MODIFIED", prio(pod("high", "h"), 1000))
    await w.settle()
    assert [n for n, _ in w.calls()].count("evict_dry") == 1
    w.clock += 5
    w.controller.kick("h")
    await w.settle()
    assert ("evict", "low3") in w.calls()
    # A real eviction failing: the claim keeps only what was evicted (here
    # nothing, so none), and the pod is not retried before its backoff.
    w2 = Cluster()
    await w2.fill()
    w2.api.fail["evict"] = ApiException(status=500, reason="Internal")
    await w2.high()
    assert [n for n, _ in w2.calls()][:3] == ["evict_dry", "nominate", "evict"]
    assert ("nominate", ("high", None)) in w2.calls()
    assert w2.controller.ledger.nominations() == {}
    assert [n for n, _ in w2.calls()].count("evict") == 1


async def test_nobody_is_evicted_for_a_pod_that_is_gone() -> None:
    w = Cluster()
    await w.fill()
    w.api.gone.add("high")
    await w.high()
    assert [n for n, _ in w.calls()] == ["evict_dry", "nominate"]
    assert w.controller.ledger.nominations() == {}


async def test_never_equal_priority_and_off_evict_nobody() -> None:
    for settings, spec, priority in (
        ({}, {"preemptionPolicy": "Never"}, 1000),
        ({}, {}, 0),
        ({"preemption": False}, {}, 1000),
    ):
        w = Cluster(**settings)
        await w.fill()
        w.controller.pod_event("ADDED", prio(pod("high", "h"), priority, **spec))
        await w.settle()
        assert [n for n, _ in w.calls()] == ["set_pod_condition", "event"], settings
        assert w.api.of("set_pod_condition")[0][1] == names.REASON_WAITING


def nominated(p: dict[str, Any], node: str, recorded: str | None = None) -> dict[str, Any]:
    """`p` with status.nominatedNodeName `node` and, if `recorded`, the
    operator's record of it (what kubeapi.set_nominated_node writes)."""
    p["status"]["nominatedNodeName"] = node
    if recorded is not None:
        p["metadata"]["annotations"][names.ANN_NOMINATED_NODE] = recorded
    return p


async def test_a_claim_written_by_an_earlier_run_is_restored_before_placing() -> None:
    w = Cluster()
    waiting = nominated(prio(pod("high", "h"), 1000), "n1", recorded="n1")
    w.controller.pod_event("ADDED", waiting)  # the listing after a restart
    claim = w.controller.ledger.nomination("h")
    assert claim is not None
    assert claim.node == "n1"
    # With preemption off, a leftover status claims nothing.
    w2 = Cluster(preemption=False)
    w2.controller.pod_event("ADDED", waiting)
    assert w2.controller.ledger.nominations() == {}


@pytest.mark.parametrize(
    ("node", "recorded", "gated", "deleting", "phase", "want"),
    [
        ("n1", "n1", True, False, "Pending", "n1"),  # the operator's own claim
        ("n1", None, True, False, "Pending", ""),  # forged: no record
        ("n1", "n2", True, False, "Pending", ""),  # forged: another node than recorded
        ("", "n1", True, False, "Pending", ""),  # a record, no nomination
        ("n1", "n1", False, False, "Pending", ""),  # ungated: placed, nothing to hold
        ("n1", "n1", True, True, "Pending", ""),  # going
        ("n1", "n1", True, False, "Failed", ""),  # ended
    ],
)
def test_only_a_nomination_the_operator_recorded_is_restorable(
    node: str, recorded: str | None, gated: bool, deleting: bool, phase: str, want: str
) -> None:
    p = nominated(pod("high", "h"), node, recorded)
    p["status"]["phase"] = phase
    if not gated:
        p["spec"].pop("schedulingGates")
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert restorable_claim(p) == want


@pytest.mark.parametrize(
    ("node", "recorded", "gated", "preempting", "want"),
    [
        ("", None, True, True, ""),  # nothing nominated: nothing to clear
        ("n1", "n1", True, True, ""),  # the operator's claim
        ("n1", None, True, True, "n1"),  # forged
        ("n1", "n2", True, True, "n1"),  # forged over a record of another node
        ("n1", "n1", True, False, "n1"),  # preemption off: no nomination is ours
        ("n1", None, True, False, "n1"),
        ("n1", None, False, True, ""),  # ungated: the scheduler's to nominate
    ],
)
def test_a_nomination_of_a_gated_pod_the_operator_did_not_write_is_foreign(
    node: str, recorded: str | None, gated: bool, preempting: bool, want: str
) -> None:
    p = nominated(pod("high", "h"), node, recorded)
    if not gated:
        p["spec"].pop("schedulingGates")
    assert foreign_nomination(p, preempting=preempting) == want


@pytest.mark.parametrize("preemption", [True, False])
async def test_a_forged_nomination_is_never_restored_and_is_cleared(preemption: bool) -> None:
    """After a restart (the listing), with preemption on and off: a forged
    nomination books no claim, costs one write that clears it, and the pod
    is placed as any other. Told again, nothing more is written."""
    w = Cluster(preemption=preemption)
    forged = nominated(prio(pod("high", "h"), 1000), "n1")
    w.controller.pod_event("ADDED", forged)
    assert w.controller.ledger.nominations() == {}
    w.controller.mark_synced()
    await w.settle()
    assert w.controller.ledger.nominations() == {}
    assert w.calls()[0] == ("nominate", ("high", None))
    assert [c for c in w.calls() if c[0] == "nominate"] == [("nominate", ("high", None))]
    (body,) = w.created()
    assert body["spec"]["podUID"] == "h"
    assert w.controller.pods["h"]["status"].get("nominatedNodeName") is None


async def test_a_pod_without_a_forged_nomination_costs_no_write_for_it() -> None:
    w = Cluster()
    await w.fill()
    w.controller.pod_event("ADDED", prio(pod("third", "t"), 0))
    await w.settle()
    ours = nominated(prio(pod("third", "t"), 0), "", recorded=None)
    w.controller.pod_event("MODIFIED", ours)
    await w.settle()
    assert "nominate" not in [n for n, _ in w.calls()]


async def test_a_forged_nomination_over_a_live_claim_is_set_back_to_the_claim() -> None:
    w = Cluster()
    await w.fill()
    await w.high()
    claim = w.controller.ledger.nomination("h")
    assert claim is not None
    w.api.calls.clear()
    # The echo of the operator's own write: no write.
    w.controller.pod_event("MODIFIED", nominated(prio(pod("high", "h"), 1000), "n1", "n1"))
    await w.settle()
    assert [c for c in w.calls() if c[0] == "nominate"] == []
    # Someone writes another node over it (the record still says n1).
    w.controller.pod_event("MODIFIED", nominated(prio(pod("high", "h"), 1000), "n9", "n1"))
    await w.settle()
    assert [c for c in w.calls() if c[0] == "nominate"] == [("nominate", ("high", "n1"))]
    assert w.controller.ledger.nomination("h") == claim


async def test_clearing_a_forged_nomination_leaves_another_pods_equal_status_alone() -> None:
    """Two pods with the same forged nomination share one cached status
    (slim.Alike keeps equal parts once): clearing the first one's must not
    clear the second's, whose own clearing is a write still to come."""
    w = Cluster()
    for name, uid in (("a", "ua"), ("b", "ub")):
        w.controller.pod_event("ADDED", nominated(prio(pod(name, uid), 1000), "n1"))
    a, b = w.controller.pods["ua"], w.controller.pods["ub"]
    assert a["status"] is b["status"]
    await w.controller.preemption.clear_foreign(a)
    assert w.calls() == [("nominate", ("a", None))]
    assert w.controller.pods["ua"]["status"].get("nominatedNodeName") is None
    assert w.controller.pods["ub"]["status"]["nominatedNodeName"] == "n1"
