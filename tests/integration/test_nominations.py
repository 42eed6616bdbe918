"""status.nominatedNodeName of a vNPU pod is the operator's and the scheduler's (issue 33,
item 4), on the real plane with the chart's policies, the real agent, operator and
scheduler: one node of one 910B3 chip (four vNPUs of TEMPLATE), preemption on.

A tenant with pods/status cannot nominate a node for its gated pod, nor write the
operator's record of a claim (vnpu.io/nominated-node). A nomination an exempt admin
writes on a gated pod is cleared by the operator, with preemption off and on, and the
node's other pods run (the scheduler counts a nominated pod's charge on its node).
A forged nomination is never restored as a preemption claim across an operator restart:
the capacity freed on the node goes to whoever fits, not to the pod that evicted nobody.

Node layout (prefix `nom-`): nom-a, 1 x 910B3, served by the stack's agent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from operator_harness import Stack, StackOf, get_json, pod_allocations, pod_running, pod_waiting
from test_protection import User, admin, tenant

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

# k8s134: also run on the 1.34 lane (`make test-k8s134`), since it depends on the API
# server's or the scheduler's version.
pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

__all__ = ["admin", "tenant"]  # fixtures, used by name

NODE, LABEL = "nom-a", "nomination-test"
TEMPLATE = "vir05_1c_16g"  # four fill the node's one 910B3 chip
SUFFIX = f"{os.getpid()}"
LOW, HIGH = f"vnpu-nom-low-{SUFFIX}", f"vnpu-nom-high-{SUFFIX}"
ON, OFF = ["--preemption=true"], []
NOMINATION = "status.nominatedNodeName"
RECORD = f"metadata.annotations[{names.ANN_NOMINATED_NODE}]"


@pytest.fixture(scope="module")
def stack(plane: LocalPlane, stack_of: StackOf) -> Iterator[Stack]:
    for name, value in ((LOW, 100), (HIGH, 1000)):
        plane.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                # Never: a pod of HIGH waits as any other, so that only a forged
                # nomination could make it claim a node.
                "preemptionPolicy": "Never",
            }
        )
    try:
        yield stack_of(
            [NodeSpec(name=NODE, chips={"910B3": 1}, labels={LABEL: NODE})],
            operator_extra=list(ON),
        )
    finally:
        for name in (LOW, HIGH):
            plane.kubectl("delete", "priorityclass", name, check=False)


def pod(namespace: str, name: str, cls: str = LOW, where: str = NODE) -> dict[str, Any]:
    return vnpu_pod(
        name, namespace, template=TEMPLATE, node_selector={LABEL: where},
        spec={"priorityClassName": cls},
    )  # fmt: skip


def create(plane: LocalPlane, manifest: dict[str, Any]) -> None:
    plane.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest))


def nominated(plane: LocalPlane, namespace: str, name: str) -> str:
    p = get_json(plane, "pod", "-n", namespace, name) or {}
    return str((p.get("status") or {}).get("nominatedNodeName") or "")


def nominate(name: str, node: str) -> tuple[str, ...]:
    """The kubectl arguments that write `node` as the pod's nomination."""
    body = {"status": {"nominatedNodeName": node}}
    return ("patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps(body))


def restart_operator(stack: Stack, extra: list[str]) -> None:
    stack.operator.kill()
    stack.operator.extra = extra
    stack.operator.start()


def gated(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    p: dict[str, Any] = get_json(plane, "pod", "-n", namespace, name)
    assert p["spec"].get("schedulingGates"), f"{name} was ungated"
    return p


def cleanup(plane: LocalPlane, namespace: str) -> None:
    plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=120)


# ------------------------------------------------------------------ tests


def test_a_tenant_with_pods_status_cannot_nominate_a_node_nor_write_the_claims_record(
    stack: Stack, plane: LocalPlane, namespace: str, tenant: User
) -> None:
    # Gated for good: no node has the label it selects.
    create(plane, pod(namespace, "mine", where="nowhere"))
    pod_waiting(plane, namespace, "mine")
    out = tenant.denied(NOMINATION, *nominate("mine", NODE))
    assert "only the vnpu-operator and the scheduler may" in out, out
    assert "ValidatingAdmissionPolicy" in out, out
    # The record a restarted operator restores a claim from: neither through the
    # status nor through the pod, nor at creation.
    record = {"metadata": {"annotations": {names.ANN_NOMINATED_NODE: NODE}}}
    for extra in (("--subresource=status",), ()):
        args = ("patch", "pod", "mine", "--type=merge", "-p", json.dumps(record), *extra)
        out = tenant.denied(RECORD, *args)
        assert "only the vnpu-operator may" in out, out
    forged = pod(namespace, "born-nominated", where="nowhere")
    forged["metadata"]["annotations"][names.ANN_NOMINATED_NODE] = NODE
    out = tenant.denied(RECORD, "create", "-f", "-", input=yaml.safe_dump(forged))
    assert "only the vnpu-operator may" in out, out
    # Other status writes of its own pod still work.
    condition = {"status": {"conditions": [{"type": "example.com/Mine", "status": "True"}]}}
    tenant.ok("patch", "pod", "mine", "--subresource=status", "--type=strategic",
              "-p", json.dumps(condition))  # fmt: skip
    assert nominated(plane, namespace, "mine") == ""
    assert names.ANN_NOMINATED_NODE not in gated(plane, namespace, "mine")["metadata"].get(
        "annotations", {}
    )
    cleanup(plane, namespace)


@pytest.mark.parametrize("preemption", ["off", "on"])
def test_an_exempt_admins_nomination_of_a_gated_pod_is_cleared_and_the_node_fills(
    stack: Stack, plane: LocalPlane, namespace: str, admin: User, preemption: str
) -> None:
    if preemption == "off":
        restart_operator(stack, OFF)
    try:
        # Waits for good (no node has its label), charged one vNPU of TEMPLATE.
        create(plane, pod(namespace, "parked", where="nowhere"))
        pod_waiting(plane, namespace, "parked")
        admin.ok(*nominate("parked", NODE))
        wait_for("nomination cleared", lambda: nominated(plane, namespace, "parked") == "",
                 timeout=30, interval=0.2)  # fmt: skip
        assert "was not written by the vnpu-operator; cleared" in stack.operator.log_tail()
        # Four pods fill the node: the scheduler binds every one (it counts a
        # nominated pod's charge on that node, issue 33: not the parked pod's now).
        for i in range(4):
            create(plane, pod(namespace, f"fill{i}"))
        for i in range(4):
            assert pod_running(plane, namespace, f"fill{i}")["spec"]["nodeName"] == NODE
        assert nominated(plane, namespace, "parked") == ""
        p = gated(plane, namespace, "parked")
        assert pod_allocations(plane, namespace, p["metadata"]["uid"]) == []
    finally:
        if preemption == "off":
            restart_operator(stack, list(ON))
    cleanup(plane, namespace)


def test_a_forged_nomination_is_not_restored_as_a_claim_across_an_operator_restart(
    stack: Stack, plane: LocalPlane, namespace: str, admin: User
) -> None:
    """With preemption on. A pod of high priority waits for two vNPUs (it may not
    preempt). While the operator is down, an admin nominates the node for it and a
    pod there is deleted: restored as a claim, the nomination would hold the node
    for it while that pod's vNPU is released (its agent is stopped meanwhile, so the
    release lasts), and a pod of lower priority would wait behind it."""
    for i in range(4):
        create(plane, pod(namespace, f"low{i}"))
    for i in range(4):
        pod_running(plane, namespace, f"low{i}")
    high = pod(namespace, "high", HIGH)
    high["metadata"]["annotations"][names.ANN_COUNT] = "2"
    create(plane, high)
    pod_waiting(plane, namespace, "high")
    stack.agent.kill()  # low0's vNPU stays until the agent is back (its Lease: 40 s)
    try:
        stack.operator.kill()  # SIGKILL, as in a crash
        try:
            admin.ok(*nominate("high", NODE))
            plane.kubectl("delete", "pod", "-n", namespace, "low0", "--wait=false")
        finally:
            stack.operator.start()
        wait_for("nomination cleared", lambda: nominated(plane, namespace, "high") == "",
                 timeout=30, interval=0.2)  # fmt: skip
        log = stack.operator.log_tail()
        assert f"claim on node {NODE} restored" not in log, log
        assert "was not written by the vnpu-operator; cleared" in log, log
        # Nothing is held for it: a low pod waits for capacity, not behind a claim.
        create(plane, pod(namespace, "late"))
        cond = pod_waiting(plane, namespace, "late")
        assert cond["reason"] == names.REASON_WAITING, cond
        assert "capacity held for a preempting pod" not in cond["message"], cond
        cond = pod_waiting(plane, namespace, "high")
        assert cond["reason"] == names.REASON_WAITING, cond
    finally:
        stack.agent.start()
    # low0's vNPU goes: the low pod that fits takes it; high still waits for two.
    assert pod_running(plane, namespace, "late")["spec"]["nodeName"] == NODE
    assert nominated(plane, namespace, "high") == ""
    p = gated(plane, namespace, "high")
    assert pod_allocations(plane, namespace, p["metadata"]["uid"]) == []
    cleanup(plane, namespace)
