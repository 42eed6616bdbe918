"""The API server accepts the pinning patch on gated pods, and the pod then
runs on exactly the chosen node (docs/ARCHITECTURE.md, 'From annotation to Running', steps 4-5)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from vnpu_common.wire import names
from vnpu_operator.pinning import pin_patch

pytestmark = pytest.mark.plane


@pytest.fixture(scope="module")
def two_nodes(plane: LocalPlane) -> list[str]:
    nodes = ["pin-a", "pin-b"]
    plane.add_nodes([NodeSpec(name=n, labels={"pin-zone": "z"}) for n in nodes])
    return nodes


def _get(plane: LocalPlane, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        plane.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout
    )
    return out


@pytest.mark.parametrize(
    "spec_extra",
    [
        {},
        {"nodeSelector": {"pin-zone": "z"}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pin-zone", "operator": "In", "values": ["z"]}]}]}}}},
    ],
    ids=["no-affinity", "node-selector", "existing-terms"],
)  # fmt: skip
def test_pinning_patch_is_accepted_and_lands_on_the_node(
    plane: LocalPlane, namespace: str, two_nodes: list[str], spec_extra: dict[str, Any]
) -> None:
    pod = vnpu_pod(
        "pinned",
        namespace,
        template="vir01",
        containers=["c"],
        scheduling_gates=[names.SCHEDULING_GATE],
        spec={"tolerations": [{"operator": "Exists"}], **spec_extra},
    )
    plane.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    target = two_nodes[1]
    live = _get(plane, namespace, "pinned")
    labels = {"kubernetes.io/hostname": target}
    ops = pin_patch(live, target, labels, [116])
    plane.kubectl("patch", "pod", "pinned", "-n", namespace, "--type=json", "-p", json.dumps(ops))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = _get(plane, namespace, "pinned")
        if done["status"].get("phase") == "Running":
            break
        time.sleep(0.25)
    assert done["spec"]["nodeName"] == target
    assert done["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] == "116"
    assert "schedulingGates" not in done["spec"]
