"""vNPUs as DRA devices on the real control plane (docs/DRA.md): the scheduler
allocates a device of an agent's pool to a pod's ResourceClaim, the operator
declares it in a VNPUAllocation, the agent creates the vNPU, and only then
does the binding condition let the scheduler bind the pod. The claim's end
releases the allocation and the agent destroys the vNPU.

Node layout (prefix `dra-`): dra-a and dra-b, one 910B3 each, served by one
agent with --dra: each chip offers 4 x vir05_1c_16g or 2 x vir10_3c_32g.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest
from dra_harness import claim_pod, claim_template, device_class
from operator_harness import Stack, StackOf, get_json

from localplane import LocalPlane, NodeSpec
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

NODES = ("dra-a", "dra-b")
SMALL = "vir05_1c_16g"


@pytest.fixture(scope="module")
def stack(stack_of: StackOf, plane: LocalPlane) -> Stack:
    plane.apply(device_class())
    return stack_of(
        [NodeSpec(name=n, chips={"910B3": 1}) for n in NODES], agent_extra=["--dra", "true"]
    )


def pod_claim(plane: LocalPlane, namespace: str, pod: str) -> dict[str, Any] | None:
    p = get_json(plane, "pod", "-n", namespace, pod) or {}
    statuses = (p.get("status") or {}).get("resourceClaimStatuses") or []
    name = next((s.get("resourceClaimName") for s in statuses if s.get("resourceClaimName")), None)
    if not name:
        return None
    claim: dict[str, Any] | None = get_json(plane, "resourceclaim", "-n", namespace, name)
    return claim


def claim_allocations(plane: LocalPlane, namespace: str, claim_uid: str) -> list[dict[str, Any]]:
    got = get_json(
        plane, "vnpuallocations", "-n", namespace, "-l", f"{names.LABEL_CLAIM_UID}={claim_uid}"
    )
    return list((got or {}).get("items", []))


def bound_node(plane: LocalPlane, namespace: str, pod: str) -> str | None:
    p = get_json(plane, "pod", "-n", namespace, pod) or {}
    node = (p.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def node_vnpus(plane: LocalPlane, node: str) -> dict[int, str]:
    vn = get_json(plane, "vnpunode", node) or {}
    return {
        v["id"]: v["template"]
        for chip in (vn.get("status") or {}).get("chips") or []
        for v in chip.get("vnpus") or []
    }


def test_a_claims_vnpu_exists_before_its_pod_binds_and_goes_with_the_claim(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(claim_template(namespace, "small", SMALL))
    plane.apply(claim_pod(namespace, "one", "small"))

    def bound() -> str | None:
        return bound_node(plane, namespace, "one")

    node = wait_for("pod bound", bound, timeout=60)
    # Bound means the binding condition was True, which the operator sets only
    # from a Ready allocation: the vNPU existed first.
    claim = pod_claim(plane, namespace, "one")
    assert claim is not None
    uid = claim["metadata"]["uid"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (names.DRA_DRIVER, node)
    (alloc,) = claim_allocations(plane, namespace, uid)
    assert alloc["metadata"]["name"] == names.dra_allocation_name(uid, result["device"])
    assert alloc["status"]["phase"] == names.PHASE_READY
    spec = alloc["spec"]
    assert spec["claim"] == {
        "name": claim["metadata"]["name"],
        "uid": uid,
        "request": "npu",
        "device": result["device"],
    }
    assert (spec["nodeName"], spec["template"]) == (node, SMALL)
    (owner,) = alloc["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("ResourceClaim", uid)
    # The device the scheduler chose declares the binding conditions, so it waited
    # for them, and the pod was scheduled no earlier than the vNPU was ready.
    slices = get_json(plane, "resourceslices", "--field-selector", f"spec.nodeName={node}")
    device = next(
        d
        for sl in (slices or {}).get("items", [])
        for d in sl["spec"].get("devices") or []
        if d["name"] == result["device"]
    )
    assert device["bindingConditions"] == [names.DRA_COND_READY]
    assert device["bindingFailureConditions"] == [names.DRA_COND_FAILED]
    ready_at = next(
        c["lastTransitionTime"] for c in alloc["status"]["conditions"] if c["type"] == "Ready"
    )
    pod = get_json(plane, "pod", "-n", namespace, "one")
    scheduled_at = next(
        c["lastTransitionTime"]
        for c in pod["status"]["conditions"]
        if c["type"] == "PodScheduled" and c["status"] == "True"
    )
    assert ready_at <= scheduled_at
    (entry,) = claim["status"]["devices"]
    ready = {c["type"]: c["status"] for c in entry["conditions"]}
    assert ready[names.DRA_COND_READY] == "True"
    wait_for("vNPU listed", lambda: node_vnpus(plane, node).get(spec["vnpuId"]) == SMALL)

    plane.kubectl("delete", "pod", "-n", namespace, "one", "--wait=false")
    wait_for("allocation gone", lambda: not claim_allocations(plane, namespace, uid), timeout=60)
    wait_for("vNPU destroyed", lambda: spec["vnpuId"] not in node_vnpus(plane, node), timeout=30)


def test_devices_are_never_shared_and_a_freed_one_goes_to_the_next_pod(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """Two chips offer 8 x vir05_1c_16g; the ninth pod waits in the scheduler
    until one of the eight goes."""
    plane.apply(claim_template(namespace, "small", SMALL))
    pods = [f"fill-{i}" for i in range(9)]
    for name in pods:
        plane.apply(claim_pod(namespace, name, "small"))

    def bound_count() -> int | None:
        n = sum(1 for p in pods if bound_node(plane, namespace, p))
        return n if n >= 8 else None

    wait_for("eight bound", bound_count, timeout=120)
    time.sleep(3)
    assert bound_count() == 8
    waiting = next(p for p in pods if not bound_node(plane, namespace, p))
    allocs = (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items", [])
    held = Counter((a["spec"]["nodeName"], a["spec"]["vnpuId"]) for a in allocs)
    assert len(held) == 8, held
    assert set(held.values()) == {1}, held
    devices = Counter((a["spec"]["nodeName"], a["spec"]["claim"]["device"]) for a in allocs)
    assert set(devices.values()) == {1}

    gone = next(p for p in pods if p != waiting)
    plane.kubectl("delete", "pod", "-n", namespace, gone, "--wait=false")
    wait_for(f"{waiting} bound", lambda: bound_node(plane, namespace, waiting), timeout=90)
    for name in pods:
        plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)
    wait_for(
        "every allocation released",
        lambda: not (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items"),
        timeout=90,
    )
    # The pods and their claims gone too: the next test starts with empty chips.
    wait_for(
        "every pod and claim gone",
        lambda: not (get_json(plane, "pods,resourceclaims", "-n", namespace) or {}).get("items"),
        timeout=90,
    )


def test_a_failed_create_gives_the_claim_back_to_the_scheduler(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """dra-b's chip is cordoned (its agent publishes no device for it), so the scheduler can only
    try dra-a, whose driver refuses every create: the device fails its binding,
    the scheduler gives the claim up and tries again, each try's allocation is
    released, and the pod never binds. Nothing is left once the pod goes."""

    def cordon(node: str, chips: list[dict[str, Any]]) -> None:
        patch = json.dumps({"spec": {"cordonedChips": chips}})
        plane.kubectl("patch", "vnpunode", node, "--type=merge", "-p", patch)

    def offers_devices(node: str) -> bool:
        slices = get_json(plane, "resourceslices", "--field-selector", f"spec.nodeName={node}")
        return any(sl["spec"].get("devices") for sl in (slices or {}).get("items", []))

    def on(node: str) -> list[dict[str, Any]]:
        items = (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items", [])
        return [a for a in items if a["spec"]["nodeName"] == node]

    def failures_on_a() -> float:
        # The operator counts each allocation its agent reported Failed.
        prefix = 'vnpu_operator_allocation_failures_total{node="dra-a"} '
        line = next((x for x in stack.operator.metrics().splitlines() if x.startswith(prefix)), "")
        return float(line[len(prefix) :] or 0)

    cordon("dra-b", [{"chip": 0, "reason": "test: only dra-a is open"}])
    wait_for("dra-b's devices withdrawn", lambda: not offers_devices("dra-b"))
    sim_a = stack.agent.sim("dra-a")
    sim_a.inject_failure("create", -8005, times=1000, message="no room, says dcmi")
    before = failures_on_a()
    try:
        plane.apply(claim_template(namespace, "big", "vir10_3c_32g"))
        plane.apply(claim_pod(namespace, "stubborn", "big"))
        seen_most = 0

        def retried() -> bool:
            nonlocal seen_most
            seen_most = max(seen_most, len(on("dra-a")))
            return failures_on_a() >= before + 2

        # A second failure means the first claim was given back and allocated again.
        wait_for("the claim given back and tried again", retried, timeout=120, interval=0.5)
        assert bound_node(plane, namespace, "stubborn") is None
        assert seen_most <= 1, "a given-back claim's allocation outlived its device"
    finally:
        plane.kubectl("delete", "pod", "-n", namespace, "stubborn", "--wait=false", check=False)
        sim_a.clear_faults()
        cordon("dra-b", [])
    wait_for("nothing left on dra-a", lambda: not on("dra-a"), timeout=60)
    wait_for("dra-b's devices offered again", lambda: offers_devices("dra-b"))


def test_an_annotated_pod_is_never_placed_on_a_dra_node(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    from localplane.pods import vnpu_pod

    plane.apply(vnpu_pod("annotated", namespace, template=SMALL))
    time.sleep(3)
    p = get_json(plane, "pod", "-n", namespace, "annotated") or {}
    assert not (p.get("spec") or {}).get("nodeName")
    conds = {c["type"]: c for c in (p.get("status") or {}).get("conditions") or []}
    waiting = conds.get(names.POD_COND_ALLOCATED)
    assert waiting is not None
    assert waiting["status"] == "False"
    assert "DRA" in waiting["message"], waiting
    plane.kubectl("delete", "pod", "-n", namespace, "annotated", "--wait=false")


def test_resource_quota_counts_vnpu_devices_by_the_device_class(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """A namespace's quota of the chart's DeviceClass holds: the second pod's
    claim is refused at creation, so no second vNPU is allocated or made."""
    key = f"{names.DRA_DEVICE_CLASS}.deviceclass.resource.k8s.io/devices"
    plane.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "one-vnpu", "namespace": namespace},
            "spec": {"hard": {key: "1"}},
        }
    )
    wait_for(
        "quota counted",
        lambda: (
            (get_json(plane, "resourcequota", "-n", namespace, "one-vnpu") or {})
            .get("status", {})
            .get("hard")
        ),
    )
    plane.apply(claim_template(namespace, "small", SMALL))
    plane.apply(claim_pod(namespace, "first", "small"))
    wait_for("first bound", lambda: bound_node(plane, namespace, "first"), timeout=60)
    plane.apply(claim_pod(namespace, "second", "small"))

    def refused() -> bool:
        events = plane.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
        return "exceeded quota" in events

    wait_for("the second claim refused by the quota", refused, timeout=60)
    assert bound_node(plane, namespace, "second") is None
    allocs = (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items", [])
    assert len(allocs) == 1
    used = get_json(plane, "resourcequota", "-n", namespace, "one-vnpu")["status"]["used"]
    assert used[key] == "1"
    for name in ("first", "second"):
        plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
