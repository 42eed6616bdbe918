"""vNPU quota, on the real plane with the real agent, operator, scheduler and quota
controller: each vNPU pod carries its charge (requests of vnpu.io/aicore, memory-mb,
vnpus), each node advertises its chips' totals, and a plain ResourceQuota caps a
namespace. Over-quota pods are refused with namespace, resource, used and hard;
another namespace is unaffected; freed quota lets the next pod in; a pod that fits
quota but not capacity waits for capacity; lowering a quota touches nothing running;
an operator restart mid-burst counts nothing twice; a pod the operator placed is
never refused by the scheduler, even on a full node while other pods terminate."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from operator_harness import (
    Stack,
    StackOf,
    apply_quota,
    get_json,
    pod_allocations,
    pod_running,
    pod_waiting,
)

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

# k8s134: also run on the 1.34 lane (`make test-k8s134`), since it depends on the API
# server's or the scheduler's version.
pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

NODE, LABEL = "quota-a", "quota-test"
TEMPLATE = "vir05_1c_16g"  # 5 AICore, 16 GiB: four fill a 910B3 chip
AICORE, MEMORY, VNPUS = names.RES_AICORE, names.RES_MEMORY_MB, names.RES_VNPUS
CAPACITY = 8  # pods of TEMPLATE on the node's two chips


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name=NODE, chips={"910B3": 2}, labels={LABEL: NODE})],
    )


def pod(namespace: str, name: str, count: int = 1) -> dict[str, Any]:
    return vnpu_pod(name, namespace, template=TEMPLATE, count=count, node_selector={LABEL: NODE})


def create(plane: LocalPlane, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """kubectl create as a user would: the refusal, if any, is in stderr."""
    return plane.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest), check=False)


def set_quota(plane: LocalPlane, namespace: str, **hard: int) -> None:
    keys = {"aicore": AICORE, "memory_mb": MEMORY, "vnpus": VNPUS}
    apply_quota(plane, namespace, {f"requests.{keys[k]}": str(v) for k, v in hard.items()})


def used(plane: LocalPlane, namespace: str) -> dict[str, str]:
    return plane.quota_used(namespace, "vnpu")


def refused_for_quota(proc: subprocess.CompletedProcess[str], namespace: str) -> str:
    """Ours (the webhook's) names the namespace; in a burst the API server's own
    quota admission may answer first. Either way: the resource, used and limit."""
    assert proc.returncode != 0, f"admitted: {proc.stdout}"
    err = proc.stderr
    ours = f"namespace {namespace} is over its vNPU quota: requests.{AICORE}" in err
    theirs = "exceeded quota: vnpu" in err and f"requests.{AICORE}" in err
    assert ours or theirs, err
    assert "used" in err, err
    return err


def delete(plane: LocalPlane, namespace: str, *pods: str) -> None:
    plane.kubectl("delete", "pod", "-n", namespace, *pods, "--wait=true", timeout=120)


def test_the_node_advertises_its_chip_totals_and_gets_them_back(
    stack: Stack, plane: LocalPlane
) -> None:
    # Per template too: how many of it the two empty 910B3 chips hold (4 and 2 a chip).
    want = {AICORE: "40", MEMORY: str(2 * 64 * 1024), VNPUS: "32",
            names.template_resource("vir05_1c_16g"): "8",
            names.template_resource("vir10_3c_32g"): "4"}  # fmt: skip

    def shown() -> dict[str, dict[str, str]]:
        status = (get_json(plane, "node", NODE) or {}).get("status") or {}
        return {
            s: {k: v for k, v in (status.get(s) or {}).items() if k.startswith("vnpu.io/")}
            for s in ("capacity", "allocatable")
        }

    wait_for("totals advertised", lambda: shown() == {"capacity": want, "allocatable": want},
             timeout=30, interval=0.3)  # fmt: skip
    # A kubelet re-registering after a reboot zeroes extended resources; so may an admin.
    zero = {"status": {"capacity": {AICORE: "0"}, "allocatable": {VNPUS: None}}}
    plane.kubectl("patch", "node", NODE, "--subresource=status", "--type=merge",
                  "-p", json.dumps(zero))  # fmt: skip
    wait_for("totals restored", lambda: shown() == {"capacity": want, "allocatable": want},
             timeout=30, interval=0.3)  # fmt: skip


def test_an_over_quota_burst_is_refused_and_another_namespace_is_unaffected(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    other = f"{namespace[:50]}-b"
    plane.kubectl("create", "namespace", other)
    try:
        set_quota(plane, namespace, aicore=15)  # three vNPUs of TEMPLATE
        set_quota(plane, other, vnpus=2)
        results = [create(plane, pod(namespace, f"a{i}")) for i in range(5)]
        admitted = [i for i, r in enumerate(results) if r.returncode == 0]
        assert admitted == [0, 1, 2], [r.stderr for r in results]
        for r in results[3:]:
            refused_for_quota(r, namespace)
        # Once the quota's status has caught up, the refusal is the webhook's: all four facts.
        wait_for("used counted", lambda: used(plane, namespace).get(f"requests.{AICORE}") == "15",
                 timeout=30)  # fmt: skip
        err = refused_for_quota(create(plane, pod(namespace, "a5")), namespace)
        assert (
            f"namespace {namespace} is over its vNPU quota: requests.{AICORE} requested 5, "
            f"used 15, hard 15 (ResourceQuota {namespace}/vnpu)"
        ) in err

        # The other namespace has its own quota, untouched by the first one's burst.
        for i in range(2):
            assert create(plane, pod(other, f"b{i}")).returncode == 0
        for name in ("a0", "a1", "a2"):
            pod_running(plane, namespace, name)
        for name in ("b0", "b1"):
            pod_running(plane, other, name)
        assert used(plane, other)[f"requests.{VNPUS}"] == "2"

        # Freed quota lets the next pod in.
        delete(plane, namespace, "a0")
        wait_for("quota freed", lambda: create(plane, pod(namespace, "a6")).returncode == 0,
                 timeout=30, interval=0.5)  # fmt: skip
        pod_running(plane, namespace, "a6")
        assert used(plane, namespace)[f"requests.{AICORE}"] == "15"
    finally:
        plane.kubectl("delete", "pods", "--all", "-n", other, "--wait=true", timeout=120)
        plane.kubectl("delete", "namespace", other, "--wait=false", check=False)
        plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=120)


def test_quota_and_capacity_are_judged_apart(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    set_quota(plane, namespace, vnpus=CAPACITY + 4)
    try:
        # Fits the quota, not the node: admitted, and it waits for capacity.
        for i in range(CAPACITY):
            assert create(plane, pod(namespace, f"fill-{i}")).returncode == 0
        assert create(plane, pod(namespace, "waiter")).returncode == 0
        for i in range(CAPACITY):
            pod_running(plane, namespace, f"fill-{i}")
        assert pod_waiting(plane, namespace, "waiter")["reason"] == names.REASON_WAITING

        # Fits the node, not the quota: refused, although a deletion frees a chip's room.
        set_quota(plane, namespace, vnpus=CAPACITY + 1)
        delete(plane, namespace, "fill-0")
        refused = create(plane, pod(namespace, "greedy", count=2))
        assert refused.returncode != 0
        assert f"requests.{VNPUS}" in refused.stderr, refused.stderr
        # The waiter takes the freed room: the scheduler never refuses a pod the
        # operator placed on a full node (its sum of requests agrees with the ledger).
        pod_running(plane, namespace, "waiter")
        scheduled = get_json(plane, "pod", "-n", namespace, "waiter")["status"]["conditions"]
        assert {c["type"]: c["status"] for c in scheduled}["PodScheduled"] == "True"
    finally:
        plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=120)


def test_lowering_a_quota_below_use_touches_nothing_running(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    set_quota(plane, namespace, vnpus=3)
    try:
        for i in range(3):
            assert create(plane, pod(namespace, f"p{i}")).returncode == 0
        before = {
            n: pod_running(plane, namespace, n)["metadata"]["uid"] for n in ("p0", "p1", "p2")
        }
        books = {n: pod_allocations(plane, namespace, uid) for n, uid in before.items()}
        set_quota(plane, namespace, vnpus=1)
        refused = create(plane, pod(namespace, "p3"))
        assert refused.returncode != 0
        assert f"requests.{VNPUS} requested 1, used 3, hard 1" in refused.stderr
        for n, uid in before.items():
            again = pod_running(plane, namespace, n)
            assert again["metadata"]["uid"] == uid
            assert [a["metadata"]["name"] for a in pod_allocations(plane, namespace, uid)] == [
                a["metadata"]["name"] for a in books[n]
            ]
    finally:
        plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=120)


def test_an_operator_restart_mid_burst_counts_nothing_twice(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    set_quota(plane, namespace, vnpus=4)
    try:
        for i in range(3):
            assert create(plane, pod(namespace, f"r{i}")).returncode == 0
        stack.operator.kill()
        stack.operator.start()
        uids = [pod_running(plane, namespace, f"r{i}")["metadata"]["uid"] for i in range(3)]
        allocs = [a for uid in uids for a in pod_allocations(plane, namespace, uid)]
        assert len(allocs) == 3
        assert used(plane, namespace)[f"requests.{VNPUS}"] == "3"
        assert create(plane, pod(namespace, "r3")).returncode == 0
        wait_for("used counted", lambda: used(plane, namespace)[f"requests.{VNPUS}"] == "4",
                 timeout=30)  # fmt: skip
        refused_for_quota_of(create(plane, pod(namespace, "r4")), namespace, VNPUS)
        pod_running(plane, namespace, "r3")
    finally:
        plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=120)


def refused_for_quota_of(
    proc: subprocess.CompletedProcess[str], namespace: str, resource: str
) -> None:
    assert proc.returncode != 0
    assert f"namespace {namespace} is over its vNPU quota: requests.{resource}" in proc.stderr


def test_a_vnpu_pod_that_names_its_own_charge_gets_the_true_one(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    # (A pod asking for no vNPUs may not request them at all: test_protection.py.)
    forged = pod(namespace, "forged")
    forged["spec"]["containers"][0]["resources"] = {"limits": {AICORE: "1", VNPUS: "1"}}
    assert create(plane, forged).returncode == 0
    limits = get_json(plane, "pod", "-n", namespace, "forged")["spec"]["containers"][0]
    assert limits["resources"]["limits"] == {
        AICORE: "5", MEMORY: "16384", VNPUS: "1", names.template_resource(TEMPLATE): "1"
    }  # fmt: skip
    pod_running(plane, namespace, "forged")
    delete(plane, namespace, "forged")
