"""A pod books exactly what its namespace was charged (issue 33, item 5), on the real
plane with the real webhook, agents, operator and scheduler.

vir04 takes 4 AICore and 4096 MB on a 910 chip, 4 AICore and 12288 MB on a 310P3. A pod
asking for vir04 without vnpu.io/chip-model while only 910 chips offer it is charged
4096 MB. A 310P3 node joining while it waits does not get it: it waits on, told its
charge and the way out, and is placed once a node of its size may take it. A pod that
names 310P3 is charged 12288 MB and goes there.

Node layout (prefix `cs-`): cs-910, 1 x 910, from the start; cs-310, 1 x 310P3, joins
mid-wait (an agent of its own). Only nodes labelled charged-size-test=late are for
the test's pods, so the pod waits until a node of either model has the label.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import Stack, StackOf, get_json, pod_allocations, pod_running, pod_waiting

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE, AgentProcess
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names
from vnpu_operator.placement import Reason

pytestmark = pytest.mark.plane

SMALL, BIG, LABEL = "cs-910", "cs-310", "charged-size-test"
TEMPLATE = "vir04"


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name=SMALL, chips={"910": 1})],
    )


def create(plane: LocalPlane, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return plane.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest), check=False)


def charge(p: dict[str, Any]) -> dict[str, str]:
    """The vnpu.io requests the webhook wrote."""
    return {
        k: v
        for c in p["spec"]["containers"]
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items()
        if k.startswith(names.RESOURCE_PREFIX)
    }


def test_a_node_of_another_model_joining_mid_wait_does_not_get_a_pod_charged_otherwise(
    stack: Stack, plane: LocalPlane, namespace: str, tmp_path: Path
) -> None:
    made = create(plane, vnpu_pod("small", namespace, template=TEMPLATE,
                                  node_selector={LABEL: "late"}))  # fmt: skip
    assert made.returncode == 0, made.stderr
    p = get_json(plane, "pod", "-n", namespace, "small")
    assert charge(p) == {
        names.RES_AICORE: "4",
        names.RES_MEMORY_MB: "4096",
        names.RES_VNPUS: "1",
        names.template_resource("vir04"): "1",
    }
    pod_waiting(plane, namespace, "small")

    plane.add_nodes([NodeSpec(name=BIG, chips={"310P3": 1}, labels={LABEL: "late"})])
    agent = AgentProcess(plane, tmp_path / "agent", [BIG]).start()
    try:

        def told() -> dict[str, Any] | None:
            cond = pod_waiting(plane, namespace, "small")
            return cond if Reason.CHARGED_SIZE.label in cond["message"] else None

        cond = wait_for("small told of its charge", told, timeout=60, interval=0.3)
        assert cond["reason"] == names.REASON_WAITING, cond
        assert "charged 4 AICore, 4096 MB a vNPU at admission" in cond["message"], cond
        assert names.ANN_CHIP_MODEL in cond["message"], cond
        # A pod naming the 310P3 is charged its size and placed there at once.
        made = create(plane, vnpu_pod("big", namespace, template=TEMPLATE, chip_model="310P3",
                                      node_selector={LABEL: "late"}))  # fmt: skip
        assert made.returncode == 0, made.stderr
        big = pod_running(plane, namespace, "big")
        assert big["spec"]["nodeName"] == BIG
        assert charge(big)[names.RES_MEMORY_MB] == "12288"
        # Free capacity on the 310P3 all along: the small pod still waits, holding nothing.
        p = get_json(plane, "pod", "-n", namespace, "small")
        assert p["spec"].get("schedulingGates"), "small was ungated"
        assert pod_allocations(plane, namespace, p["metadata"]["uid"]) == []
        # A node of its size becomes one of its nodes: placed there.
        plane.kubectl("label", "node", SMALL, f"{LABEL}=late")
        assert pod_running(plane, namespace, "small")["spec"]["nodeName"] == SMALL
        (alloc,) = pod_allocations(plane, namespace, p["metadata"]["uid"])
        assert alloc["spec"]["nodeName"] == SMALL
        plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=120)
    finally:
        agent.stop()
        plane.kubectl("delete", "node", BIG, "--wait=false", check=False)
        plane.kubectl("delete", "vnpunode", BIG, "--wait=false", check=False)
        plane.kubectl("delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(BIG),
                      "--wait=false", check=False)  # fmt: skip
        plane.kubectl("label", "node", SMALL, f"{LABEL}-", check=False)
