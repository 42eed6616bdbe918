"""API economy: our components' writes per pod lifecycle, counted from the
API server's audit log (writes only), told apart by User-Agent.

A lifecycle is: pod created -> vNPU created -> pod Running -> pod deleted ->
vNPU destroyed -> pod gone. Writes about the pod (the pod, its status, its
allocations and their status, Events) are counted per pod. VNPUNode status
writes are per node and coalesced, so they are counted over a batch of pods
sharing a node; Lease renewals are per node and time, not per pod.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from operator_harness import OUR_AGENTS, Stack, StackOf, audit_since, component, get_json

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

OURS = OUR_AGENTS
BUDGET = 8
# The agent's production coalescing interval for VNPUNode writes (the
# harness default is 0.2 s, for fast tests): a change waits at most this long
# for its write.
INVENTORY_INTERVAL = 5
# Quiet for longer than that: no VNPUNode write can still be pending.
QUIET_SECONDS = INVENTORY_INTERVAL + 1


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name="wr-a", chips={"910B3": 4})],
        agent_extra=[f"--inventory-min-interval-seconds={INVENTORY_INTERVAL}"],
    )


def what(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "?")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event.get('verb')} {resource}"


def busy(event: dict[str, Any]) -> bool:
    """A write of ours that is not a Lease renewal. Renewals run on a clock
    (the leader's every 0.5 s in the Stack, each agent's per node), never
    stop, and are no sign of work still under way."""
    resource = (event.get("objectRef") or {}).get("resource")
    return component(event) in OURS and resource != "leases"


def settle(plane: LocalPlane, seconds: float = QUIET_SECONDS, limit: float = 90) -> int:
    """Waits until our components have made no write but Lease renewals for
    `seconds` (other clients, e.g. kwok renewing node Leases, never stop
    either); returns the audit log's size then. Gives up after `limit`
    seconds: the assertions that follow then see the writes that kept coming."""
    offset = plane.audit_log.stat().st_size
    quiet_since = started = time.monotonic()
    while time.monotonic() - quiet_since < seconds and time.monotonic() - started < limit:
        time.sleep(0.25)
        size = plane.audit_log.stat().st_size
        if size != offset:
            if any(busy(e) for e in audit_since(plane, offset)):
                quiet_since = time.monotonic()
            offset = size
    return offset


def run_pods(plane: LocalPlane, namespace: str, count: int) -> None:
    pods = [vnpu_pod(f"w{i}", namespace) for i in range(count)]
    plane.apply({"apiVersion": "v1", "kind": "List", "items": pods})

    def all_running() -> bool:
        items = (get_json(plane, "pods", "-n", namespace) or {}).get("items", [])
        return len(items) == count and all(p["status"].get("phase") == "Running" for p in items)

    wait_for("pods Running", all_running, timeout=60)
    plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false")
    wait_for(
        "pods gone",
        lambda: not (get_json(plane, "pods", "-n", namespace) or {}).get("items"),
        timeout=60,
    )


def tally(
    events: list[dict[str, Any]], namespace: str, nodes: list[str]
) -> tuple[Counter[str], Counter[str]]:
    """Our components' writes: (about the namespace's pods, about the nodes)."""
    per_pod: Counter[str] = Counter()
    per_node: Counter[str] = Counter()
    node_objects = set(nodes) | {names.lease_name(n) for n in nodes}
    for e in events:
        who = component(e)
        if who not in OURS:
            continue
        ref = e.get("objectRef") or {}
        if ref.get("namespace") == namespace:
            per_pod[f"{who}: {what(e)}"] += 1
        elif ref.get("name") in node_objects:
            per_node[f"{who}: {what(e)}"] += 1
    return per_pod, per_node


def report(title: str, counts: Counter[str], pods: int) -> None:
    print(f"\n{title} ({pods} pod(s)):")
    for key, n in sorted(counts.items()):
        print(f"  {n / pods:5.2f}  {key}")
    print(f"  {sum(counts.values()) / pods:5.2f}  total per pod")


def test_writes_per_lifecycle_of_one_pod(stack: Stack, plane: LocalPlane, namespace: str) -> None:
    offset = settle(plane)
    run_pods(plane, namespace, 1)
    settle(plane)
    events = audit_since(plane, offset)
    per_pod, other = tally(events, namespace, stack.node_names)
    report("writes about the pod", per_pod, 1)
    report("node-level writes (VNPUNode, Lease)", other, 1)

    assert sum(per_pod.values()) <= BUDGET, per_pod
    # The indispensable steps, each exactly once.
    assert per_pod[f"{names.USER_AGENT_OPERATOR}: create vnpuallocations"] == 1
    assert per_pod[f"{names.USER_AGENT_AGENT}: patch vnpuallocations/status"] == 1
    assert per_pod[f"{names.USER_AGENT_OPERATOR}: delete vnpuallocations"] == 1
    # Kopf itself writes nothing: no bookkeeping annotations, no finalizers.
    assert not [e for e in events if str(e.get("userAgent", "")).startswith("kopf")]


def test_writes_per_lifecycle_over_a_batch_include_node_inventory(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    pods = 8
    offset = settle(plane)
    run_pods(plane, namespace, pods)
    settle(plane)
    events = audit_since(plane, offset)
    per_pod, other = tally(events, namespace, stack.node_names)
    node_level = Counter({k: v for k, v in other.items() if "leases" not in k})
    everything = per_pod + node_level
    report("all writes but Lease renewals", everything, pods)
    assert sum(everything.values()) / pods <= BUDGET, everything


def test_idle_cluster_writes_only_lease_renewals(stack: Stack, plane: LocalPlane) -> None:
    # Quiet for longer than the agent's VNPUNode coalescing interval, so a
    # write still pending from the tests before is not counted as idle.
    offset = settle(plane)
    time.sleep(6)
    events = [e for e in audit_since(plane, offset) if component(e) in OURS]
    kinds = Counter(what(e) for e in events)
    print(f"\nidle 6 s: {dict(kinds)}")
    assert set(kinds) <= {"update leases", "patch leases"}, kinds
