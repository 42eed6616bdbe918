"""One request on every cluster, where no DRA node offers the template (Kubernetes 1.30 to
1.35, DRA off, or annotation nodes only): `limits: {vnpu.io/<template>: N}` runs through the
annotation path, and a ResourceQuota on requests.vnpu.io/<template> counts it beside the
annotation path's own charges. Real plane, operator, agent, scheduler and quota controller;
also on the 1.34 lane (k8s134), where the API server knows nothing of DRA extended
resources."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from dra_harness import limits_deployment, limits_pod
from operator_harness import Stack, StackOf, apply_quota, get_json, pod_allocations

from localplane import LocalPlane, NodeSpec
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

NODE = "one-plain-a"
SMALL = "vir05_1c_16g"  # four fill a 910B3 chip
SMALL_RES = names.template_resource(SMALL)


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of([NodeSpec(name=NODE, chips={"910B3": 1}, labels={"one-request": NODE})])


def _pod(namespace: str, name: str, count: int) -> dict[str, Any]:
    return limits_pod(namespace, name, {SMALL: count}, nodeSelector={"one-request": NODE})


def _ready(plane: LocalPlane, namespace: str, name: str) -> int:
    """How many Ready allocations pod `name` has."""
    pod = get_json(plane, "pod", "-n", namespace, name) or {}
    uid = (pod.get("metadata") or {}).get("uid")
    if not uid:
        return 0
    return len([a for a in pod_allocations(plane, namespace, uid)
                if (a.get("status") or {}).get("phase") == names.PHASE_READY])  # fmt: skip


def test_the_node_lists_each_template_it_offers(stack: Stack, plane: LocalPlane) -> None:
    """The scheduler admits vnpu.io/<template> only on a node that lists it:
    an annotation node lists what its empty chips hold of each template."""

    def listed() -> dict[str, str]:
        node = get_json(plane, "node", NODE) or {}
        return dict((node.get("status") or {}).get("capacity") or {})

    wait_for("the node lists vnpu.io/<template>", lambda: SMALL_RES in listed(), timeout=30)
    capacity = listed()
    assert capacity[SMALL_RES] == "4"
    assert capacity[names.template_resource("vir10_3c_32g")] == "2"
    assert capacity[names.RES_VNPUS] == "16"


def test_limits_run_through_the_annotation_path_and_quota_counts_them(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    apply_quota(
        plane, namespace, {f"requests.{SMALL_RES}": "3", f"requests.{names.RES_VNPUS}": "3"}
    )
    plane.apply(_pod(namespace, "two", 2))
    wait_for(
        "pod two running with 2 vNPUs",
        lambda: _ready(plane, namespace, "two") == 2
        and (get_json(plane, "pod", "-n", namespace, "two") or {}).get("spec", {}).get("nodeName")
        == NODE,
        timeout=60,
    )  # fmt: skip
    pod = get_json(plane, "pod", "-n", namespace, "two")
    annotations = pod["metadata"]["annotations"]
    assert annotations[names.ANN_TEMPLATE] == SMALL
    assert annotations[names.ANN_COUNT] == "2"
    assert len(annotations[names.ANN_VISIBLE_DEVICES].split(",")) == 2
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits[SMALL_RES] == "2"
    assert limits[names.RES_VNPUS] == "2"
    wait_for(
        "quota counts the pod in both names",
        lambda: (
            plane.quota_used(namespace, "vnpu").get(f"requests.{SMALL_RES}") == "2"
            and plane.quota_used(namespace, "vnpu").get(f"requests.{names.RES_VNPUS}") == "2"
        ),
        timeout=30,
    )
    # Two more would make four of the template: refused, in the webhook's words or the
    # API server's (in a burst its own count answers first).
    proc = plane.kubectl(
        "create", "-f", "-", input=yaml.safe_dump(_pod(namespace, "over", 2)), check=False
    )
    assert proc.returncode != 0, proc.stdout
    assert f"requests.{SMALL_RES}" in proc.stderr or SMALL_RES in proc.stderr, proc.stderr
    # One more fits.
    plane.apply(_pod(namespace, "one", 1))
    wait_for(
        "pod one given its vNPU",
        lambda: _ready(plane, namespace, "one") == 1,
        timeout=60,
    )
    for name in ("two", "one"):
        plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
    wait_for(
        "quota freed",
        lambda: plane.quota_used(namespace, "vnpu").get(f"requests.{SMALL_RES}") == "0",
        timeout=60,
    )


def test_what_the_annotation_path_cannot_serve_is_refused_in_our_words(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    two_templates = limits_pod(namespace, "mixed", {SMALL: 1, "vir10_3c_32g": 1})
    proc = plane.kubectl("create", "-f", "-", input=yaml.safe_dump(two_templates), check=False)
    assert proc.returncode != 0
    assert "one template" in proc.stderr, proc.stderr
    half = limits_pod(namespace, "half", {SMALL: 1})
    half["spec"]["containers"][0]["resources"]["limits"][SMALL_RES] = "500m"
    proc = plane.kubectl("create", "-f", "-", input=yaml.safe_dump(half), check=False)
    assert proc.returncode != 0
    assert "whole number" in proc.stderr or "must be an integer" in proc.stderr, proc.stderr


def test_the_same_deployment_as_on_a_dra_node_runs_here(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """test_real_node_chart_dra runs this manifest on a DRA node of the real kubelet."""
    plane.apply(limits_deployment(namespace, "one-request", SMALL,
                                  node_selector={"one-request": NODE}))  # fmt: skip

    def the_pod() -> str | None:
        pods = (get_json(plane, "pods", "-n", namespace, "-l", "app=one-request") or {}).get(
            "items", []
        )
        return str(pods[0]["metadata"]["name"]) if pods else None

    name = wait_for("the Deployment's pod", the_pod, 30)
    wait_for("its vNPU", lambda: _ready(plane, namespace, name) == 1, timeout=60)
    wait_for(
        "the pod bound",
        lambda: (get_json(plane, "pod", "-n", namespace, name) or {}).get("spec", {})
        .get("nodeName") == NODE,
        timeout=30,
    )  # fmt: skip
    plane.kubectl("delete", "deployment", "-n", namespace, "one-request")
