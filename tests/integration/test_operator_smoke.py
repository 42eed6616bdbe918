"""The operator's whole lifecycle on the real plane: the smallest story."""

from __future__ import annotations

from typing import Any

import pytest
from operator_harness import Stack, StackOf, get_json, pod_allocations

from localplane import LocalPlane, NodeSpec
from localplane.components import vnpu_ids
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

# k8s134: also run on the 1.34 lane (`make test-k8s134`): the scheduling-gate path end to
# end on the older API server and scheduler.
pytestmark = pytest.mark.k8s134


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name="smoke-a", chips={"910B3": 2})],
    )


def test_pod_runs_on_its_vnpu_and_release_destroys_it(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    pod = vnpu_pod("p", namespace)
    plane.apply(pod)

    def running() -> dict[str, Any] | None:
        p = get_json(plane, "pod", "-n", namespace, "p")
        return p if p and p["status"].get("phase") == "Running" else None

    p = wait_for("pod Running", running, timeout=30)
    (alloc,) = pod_allocations(plane, namespace, p["metadata"]["uid"])
    assert p["spec"]["nodeName"] == "smoke-a"
    assert p["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] == str(alloc["spec"]["vnpuId"])
    assert alloc["status"]["phase"] == names.PHASE_READY
    assert vnpu_ids(stack.agent.sim("smoke-a")) == {alloc["spec"]["vnpuId"]: "vir05_1c_16g"}

    plane.kubectl("delete", "pod", "-n", namespace, "p", "--wait=false")
    wait_for("pod gone", lambda: get_json(plane, "pod", "-n", namespace, "p") is None, timeout=30)
    assert vnpu_ids(stack.agent.sim("smoke-a")) == {}
    assert pod_allocations(plane, namespace, p["metadata"]["uid"]) == []
