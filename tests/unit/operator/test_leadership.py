"""Only the leader reconciles and writes (leader.py, the wiring): a standby
with warm caches places nothing until it leads, then places what it has
seen; the fence refuses a write before it is sent once the renew deadline
has passed; the listeners hear each change."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from tests.unit.operator.test_controller import World, pod

from vnpu_common.kube.apiwrites import Writes
from vnpu_operator.election import Record, Timing
from vnpu_operator.leader import Leadership, NotLeading

TIMING = Timing(lease_seconds=15, renew_deadline=10.0, retry_seconds=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leadership(clock: Clock) -> tuple[Leadership, list[str], Counter]:
    registry = CollectorRegistry()
    refused = Counter("fenced", "", ["operation"], registry=registry)
    gauge = Gauge("leader", "", registry=registry)
    # Any non-None api: the fence and the changes never call it.
    lead = Leadership(
        object(),  # type: ignore[arg-type]
        "ns", "me", timing=TIMING, clock=clock, leader_gauge=gauge, refused=refused,
    )  # fmt: skip
    heard: list[str] = []
    lead.on_change(lambda: heard.append("started"), lambda: heard.append("stopped"))
    return lead, heard, refused


def renewed(lead: Leadership, sent: float) -> None:
    body = lead.election.body(lead.name, lead.namespace, wall=0.0)
    lead.election.written(Record.from_api({**body, "metadata": {"resourceVersion": "1"}}), sent)
    lead._settle()


def test_the_fence_holds_until_the_renew_deadline() -> None:
    clock = Clock()
    lead, heard, refused = leadership(clock)
    with pytest.raises(NotLeading):
        lead.check("create_allocation")
    renewed(lead, sent=clock.now)
    assert heard == ["started"]
    clock.now += 9.9
    lead.check("create_allocation")
    clock.now += 0.1  # frozen past the deadline: nothing is sent, even before the timer fires
    with pytest.raises(NotLeading):
        lead.check("create_allocation")
    assert refused.labels("create_allocation")._value.get() == 2
    lead._settle()
    assert heard == ["started", "stopped"]


def test_no_election_always_leads() -> None:
    lead = Leadership(None, "ns", "me")
    assert lead.leading()
    lead.check("patch_pod")


async def test_a_fenced_write_is_never_sent() -> None:
    errors = Counter("errors", "", ["operation", "status"], registry=CollectorRegistry())
    sent: list[Any] = []

    async def request(*args: Any, **kwargs: Any) -> Any:
        sent.append(args)
        raise AssertionError("sent")

    def fence(operation: str) -> None:
        raise NotLeading(operation)

    with pytest.raises(NotLeading):
        await Writes(errors, fence).call("delete_allocation", request, "ns", "name")
    assert sent == []
    assert next(iter(errors.collect())).samples == []  # not counted as a failed write


async def test_a_standby_places_nothing_until_it_leads_then_places_what_it_saw() -> None:
    w = World()
    leading = False
    w.controller.leading = lambda: leading
    w.add_node("n1")
    w.controller.mark_synced()
    w.controller.pod_event("ADDED", pod())
    await w.settle()
    assert w.api.calls == []
    leading = True
    w.controller.lead()
    await w.settle()
    assert w.api.names() == ["create_allocation"]


async def test_a_replica_that_stopped_leading_reconciles_nothing() -> None:
    w = World()
    leading = True
    w.controller.leading = lambda: leading
    w.add_node("n1")
    w.controller.mark_synced()
    leading = False
    w.controller.follow()
    w.controller.pod_event("ADDED", pod())
    # A key queued before the change (a retry's timer) runs and returns.
    await w.controller.reconcile("u1")
    await w.settle()
    assert w.api.calls == []


def test_a_lead_about_to_run_out_is_not_started() -> None:
    """A renewal answered just before its own deadline (a saturated API
    server) does not make a replica that does not lead start for a moment:
    it starts on an answer with a third of the deadline or more left, and
    one that leads keeps leading on either."""
    clock = Clock()
    lead, heard, _ = leadership(clock)
    renewed(lead, sent=clock.now - 7.0)  # 3 s of the 10 s deadline left: under a third
    assert heard == []
    with pytest.raises(NotLeading):
        lead.check("create_allocation")
    renewed(lead, sent=clock.now - 6.5)  # 3.5 s left
    assert heard == ["started"]
    clock.now += 1.0
    renewed(lead, sent=clock.now - 8.0)  # leading: 2 s more are 2 s more
    assert heard == ["started"]
    assert lead.leading()


async def test_a_new_leader_reconciles_the_pods_that_wait_on_it_before_the_running_ones() -> None:
    """At 10000 live pods a takeover queued the pods created during the
    outage behind every running pod's reconcile (1.5 s on 2 cores)."""
    w = World()
    leading = False
    w.controller.leading = lambda: leading
    w.add_node("n1")
    w.controller.mark_synced()
    running = []
    for i in range(3):
        p = pod(f"r{i}", f"a{i}")
        p["spec"].pop("schedulingGates")
        p["status"] = {"phase": "Running"}
        running.append(p)
    deleting = pod("d", "b0")
    deleting["spec"].pop("schedulingGates")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    for p in [*running, deleting, pod("new", "z9")]:
        w.controller.pod_event("ADDED", p)
    await w.settle()
    kicked: list[str] = []
    w.controller.queue.add = kicked.append  # type: ignore[method-assign,assignment]
    leading = True
    w.controller.lead()
    assert kicked == ["b0", "z9", "a0", "a1", "a2"]
