"""One request on every cluster, where DRA nodes offer the template (Kubernetes 1.37, KEP-5004
GA): `limits: {vnpu.io/<template>: N}` with no claim written by the user is served by the
scheduler's own claim, which becomes VNPUAllocations in the one ledger; the pod binds only
once they are Ready; quota on requests.vnpu.io/<template> counts it. On a cluster of both
kinds the pod never lands on the annotation node, which lists the name in its capacity.

Nodes (prefix `one-`): one-mixed-plain (annotation, the Stack's agent, 910B3 and 910B4
chips) and one-mixed-dra (DRA, an agent of its own with --dra, labelled vnpu.io/mode=dra,
one 910B3). vir05_1c_16g is offered by both kinds; vir05_1c_8g (910B4) only by the
annotation node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dra_harness import device_class, limits_pod, template_class
from operator_harness import Stack, StackOf, apply_quota, get_json, pod_allocations

from localplane import LocalPlane, NodeSpec
from localplane.components import AgentProcess
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

PLAIN, DRA = "one-mixed-plain", "one-mixed-dra"
MODE = {"vnpu.io/mode": "dra"}
SMALL, ONLY_PLAIN = "vir05_1c_16g", "vir05_1c_8g"
SMALL_RES = names.template_resource(SMALL)


@pytest.fixture(scope="module")
def stack(stack_of: StackOf, plane: LocalPlane) -> Stack:
    plane.apply(device_class())
    for template in (SMALL, ONLY_PLAIN):
        plane.apply(template_class(template))
    return stack_of(
        [NodeSpec(name=PLAIN, chips={"910B3": 1, "910B4": 1})],
        operator_extra=["--dra-node-selector", "vnpu.io/mode=dra"],
    )


@pytest.fixture(scope="module")
def dra_agent(
    stack: Stack, plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    plane.add_nodes([NodeSpec(name=DRA, chips={"910B3": 1}, labels=dict(MODE))])
    agent = AgentProcess(
        plane, Path(tmp_path_factory.mktemp("one-dra-agent")), [DRA], extra=["--dra", "true"]
    ).start()
    wait_for("the DRA VNPUNode", lambda: get_json(plane, "vnpunode", DRA), timeout=60)
    yield agent
    agent.kill()
    # A DRA node left on the shared plane would draw later modules' claims.
    plane.kubectl("delete", "node", DRA, "--wait=false", check=False)
    plane.kubectl("delete", "vnpunode", DRA, "--wait=false", check=False)
    plane.kubectl(
        "delete", "resourceslices", "--field-selector", f"spec.nodeName={DRA}", check=False
    )
    for template in (SMALL, ONLY_PLAIN):
        plane.kubectl("delete", "deviceclass", names.template_device_class(template), check=False)


def _pod(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    return get_json(plane, "pod", "-n", namespace, name) or {}


def test_the_scheduler_serves_limits_on_the_dra_node_through_its_own_claim(
    dra_agent: AgentProcess, plane: LocalPlane, namespace: str
) -> None:
    apply_quota(plane, namespace, {f"requests.{SMALL_RES}": "2"})
    plane.apply(limits_pod(namespace, "two", {SMALL: 2}))
    bound = wait_for(
        "pod two bound",
        lambda: _pod(plane, namespace, "two").get("spec", {}).get("nodeName"),
        timeout=90,
    )
    assert bound == DRA  # not the annotation node, which lists vnpu.io/vir05_1c_16g too
    pod = _pod(plane, namespace, "two")
    # The webhook steered it; nothing of the annotation path was added.
    assert pod["spec"]["nodeSelector"]["vnpu.io/mode"] == "dra"
    assert names.ANN_TEMPLATE not in (pod["metadata"].get("annotations") or {})
    assert not pod["spec"].get("schedulingGates")
    # The scheduler's claim, in its own shape.
    status = wait_for(
        "pod.status.extendedResourceClaimStatus",
        lambda: _pod(plane, namespace, "two").get("status", {}).get("extendedResourceClaimStatus"),
        timeout=30,
    )
    claim_name = status["resourceClaimName"]
    (mapping,) = status["requestMappings"]
    assert mapping["containerName"] == "c0"
    assert mapping["resourceName"] == SMALL_RES
    claim = get_json(plane, "resourceclaim", "-n", namespace, claim_name)
    assert names.DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION in claim["metadata"]["annotations"]
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["name"] == mapping["requestName"]
    assert request["exactly"]["deviceClassName"] == names.template_device_class(SMALL)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2
    # Its devices became allocations in the one ledger, Ready before the pod bound.
    allocs = [
        a
        for a in (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items", [])
        if (a["spec"].get("claim") or {}).get("name") == claim_name
    ]
    assert len(allocs) == 2
    assert {a["status"]["phase"] for a in allocs} == {names.PHASE_READY}
    assert len({a["spec"]["vnpuId"] for a in allocs}) == 2
    assert {a["spec"]["template"] for a in allocs} == {SMALL}
    for entry in claim["status"]["devices"]:
        conditions = {c["type"]: c["status"] for c in entry["conditions"]}
        assert conditions[names.DRA_COND_READY] == "True"
    wait_for(
        "quota counts the DRA pod",
        lambda: plane.quota_used(namespace, "vnpu").get(f"requests.{SMALL_RES}") == "2",
        timeout=30,
    )
    # The DRA node lists none of its templates: one name is never offered both ways.
    capacity = (get_json(plane, "node", DRA) or {}).get("status", {}).get("capacity", {})
    assert not [k for k in capacity if names.template_of_resource(k)]
    plain = (get_json(plane, "node", PLAIN) or {}).get("status", {}).get("capacity", {})
    assert SMALL_RES in plain
    plane.kubectl("delete", "pod", "-n", namespace, "two", "--wait=false")
    wait_for(
        "the claim's allocations released",
        lambda: (
            not [
                a
                for a in (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get(
                    "items", []
                )
                if (a["spec"].get("claim") or {}).get("name") == claim_name
            ]
        ),
        timeout=60,
    )


def test_a_template_only_annotation_nodes_offer_goes_the_annotation_path(
    dra_agent: AgentProcess, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(limits_pod(namespace, "eight", {ONLY_PLAIN: 1}))
    bound = wait_for(
        "pod eight bound",
        lambda: _pod(plane, namespace, "eight").get("spec", {}).get("nodeName"),
        timeout=90,
    )
    assert bound == PLAIN
    pod = _pod(plane, namespace, "eight")
    assert pod["metadata"]["annotations"][names.ANN_TEMPLATE] == ONLY_PLAIN
    uid = pod["metadata"]["uid"]
    (alloc,) = pod_allocations(plane, namespace, uid)
    assert alloc["status"]["phase"] == names.PHASE_READY
    assert not alloc["spec"].get("claim")
