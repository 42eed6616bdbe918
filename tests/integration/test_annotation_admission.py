"""The webhook and the operator read a pod's vnpu.io annotations alike, on the
real plane: a pod the webhook admits gets its vNPU (its containers list once
made placement refuse it, leaving it gated forever), and a count the webhook
refuses never reaches the operator.

Node (name unique to this file, prefix `ann-`): ann-a, 1 x 910B3.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_harness import Stack, StackOf, get_json, pod_allocations

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

# k8s134: also run on the 1.34 lane (`make test-k8s134`), since it depends on the API
# server's or the scheduler's version.
pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

NODE = "ann-a"
TEMPLATE = "vir05_1c_16g"


def manifest(name: str, namespace: str, annotations: dict[str, str]) -> dict[str, Any]:
    """A pod with an init container `init` and a container `app`."""
    return vnpu_pod(
        name,
        namespace,
        template=TEMPLATE,
        annotations=annotations,
        containers=("app",),
        init_containers=("init",),
    )


def create(plane: LocalPlane, pod: dict[str, Any], *dry_run: str) -> tuple[int, str]:
    # JSON, not YAML: PyYAML writes "08" unquoted, which kubectl reads as a number.
    r = plane.kubectl("create", *dry_run, "-f", "-", input=json.dumps(pod), check=False)
    return r.returncode, r.stderr


@pytest.fixture(scope="module")
def stack(plane: LocalPlane, stack_of: StackOf) -> Stack:
    s = stack_of([NodeSpec(name=NODE, chips={"910B3": 1})])
    # The webhook refuses every template until the operator's cache knows
    # what the cluster offers: wait for that by a server-side dry run.
    probe = manifest("ann-probe", "default", {})
    wait_for(
        "webhook admits a pod",
        lambda: create(plane, probe, "--dry-run=server")[0] == 0,
        timeout=60,
        interval=0.5,
    )
    return s


def test_spaced_and_repeated_containers_are_admitted_and_placed(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    pod = manifest("listed", namespace, {names.ANN_CONTAINERS: "init , app,init"})
    code, err = create(plane, pod)
    assert code == 0, err

    def ungated_with_ready_vnpu() -> tuple[dict[str, Any], dict[str, Any]] | None:
        p = get_json(plane, "pod", "-n", namespace, "listed")
        if p is None or p["spec"].get("schedulingGates"):
            return None
        allocs = pod_allocations(plane, namespace, p["metadata"]["uid"])
        ready = [a for a in allocs if (a.get("status") or {}).get("phase") == names.PHASE_READY]
        return (p, ready[0]) if len(allocs) == 1 and ready else None

    p, alloc = wait_for(
        "pod ungated with its vNPU Ready", ungated_with_ready_vnpu, timeout=60, interval=0.5
    )
    assert p["spec"]["nodeName"] == NODE
    assert alloc["spec"]["nodeName"] == NODE
    assert p["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] == str(alloc["spec"]["vnpuId"])
    # Both listed containers see the vNPU, each once.
    for container in p["spec"]["initContainers"] + p["spec"]["containers"]:
        env = [e["name"] for e in container.get("env") or []]
        assert env.count(names.ENV_VISIBLE_DEVICES) == 1, container
    # The operator never reported the pod's request as invalid.
    events = get_json(
        plane, "events", "-n", namespace, "--field-selector", "involvedObject.name=listed"
    )
    reasons = {e.get("reason") for e in (events or {}).get("items", [])}
    assert "InvalidRequest" not in reasons, reasons


def test_count_with_a_leading_zero_is_refused_by_the_webhook(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    code, err = create(plane, manifest("zero-eight", namespace, {names.ANN_COUNT: "08"}))
    assert code != 0
    assert "denied the request" in err, err
    assert 'vnpu.io/count "08" has a leading zero; expected an integer from 1 to 8' in err, err
    assert get_json(plane, "pod", "-n", namespace, "zero-eight") is None
