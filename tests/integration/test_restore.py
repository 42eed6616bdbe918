"""A namespace's Deployments backed up and restored as docs/OPERATIONS.md ("Backup and
restore") says, on the local plane with the operator and an agent running: the page's
command block is run as written (its namespace swapped for the test's). Before, a
Deployment asks for vNPUs with the documented request (`limits: {vnpu.io/<template>: 1}`)
and its pods run on their vNPUs; the namespace is deleted (its vNPUs released first) and
the exported Deployments applied again. After, the pods are new, each placed afresh with
allocations of its own, no allocation of the old pods is left anywhere, and no pod
create was refused. What the page says not to restore is refused: the old pods as
exported (the webhook: a vNPU pod that names its node), and their allocations
(allocation-protection, for the plane's system:masters admin too).

Node layout (prefix `rs-`): rs-a, one 910B3 (four vir05_1c_16g), the only node with an agent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from dra_harness import limits_deployment
from operator_harness import Stack, StackOf, get_json

from localplane import LocalPlane, NodeSpec
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
NODE = "rs-a"
TEMPLATE = "vir05_1c_16g"
REPLICAS = 2


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of([NodeSpec(name=NODE, chips={"910B3": 1}, labels={"restore": NODE})])


def documented_commands() -> str:
    """The block OPERATIONS.md marks as the one this test runs."""
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    m = re.search(r"<!-- restore-commands: [^>]*-->\n```sh\n(.*?)\n```", text, re.DOTALL)
    assert m, "docs/OPERATIONS.md lost its restore-commands block"
    return m.group(1)


def running(plane: LocalPlane, namespace: str) -> dict[str, list[dict[str, Any]]] | None:
    """pod uid -> its allocations, once REPLICAS pods of the Deployment run with one
    Ready allocation each; None before."""
    pods = (get_json(plane, "pods", "-n", namespace, "-l", "app=train") or {}).get("items", [])
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if len(live) != REPLICAS or any(p["status"].get("phase") != "Running" for p in live):
        return None
    allocations = (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items", [])
    by_pod = {
        p["metadata"]["uid"]: [
            a for a in allocations if a["spec"]["podUID"] == p["metadata"]["uid"]
        ]
        for p in live
    }
    ready = all(
        len(held) == 1 and (held[0].get("status") or {}).get("phase") == names.PHASE_READY
        for held in by_pod.values()
    )
    return by_pod if ready else None


def exported_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as a backup tool would restore it: what the API server wrote dropped."""
    meta = {k: v for k, v in pod["metadata"].items() if k not in (
        "uid", "resourceVersion", "creationTimestamp", "managedFields", "ownerReferences",
        "generateName",
    )}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod["spec"]}


def test_a_namespaces_deployments_restored_get_new_vnpus(
    stack: Stack, plane: LocalPlane, namespace: str, tmp_path: Path
) -> None:
    deployment = limits_deployment(namespace, "train", TEMPLATE, node_selector={"restore": NODE})
    deployment["spec"]["replicas"] = REPLICAS
    plane.apply(deployment)
    before = wait_for("the Deployment's pods on their vNPUs", lambda: running(plane, namespace),
                      timeout=90, interval=0.5)  # fmt: skip
    old_pods = (get_json(plane, "pods", "-n", namespace, "-l", "app=train") or {})["items"]
    old_allocations = [a for held in before.values() for a in held]

    assert shutil.which("jq"), "the documented restore uses jq: install it (apt-get install jq)"
    kubectl = Path(plane.binary("kubectl"))
    env = {
        **os.environ,
        "PATH": f"{kubectl.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "KUBECONFIG": str(plane.kubeconfig),
    }
    script = documented_commands().replace("NS=team-a", f"NS={namespace}", 1)
    assert f"NS={namespace}" in script
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"the documented restore failed:\n{proc.stdout}\n{proc.stderr}"
    backup = json.loads((tmp_path / f"{namespace}-deployments.json").read_text())
    (saved,) = backup["items"]
    assert "status" not in saved
    assert "uid" not in saved["metadata"]

    after = wait_for("the restored pods on new vNPUs", lambda: running(plane, namespace),
                     timeout=90, interval=0.5)  # fmt: skip
    assert not set(after) & set(before), "a restored pod kept an old pod's uid"
    new_allocations = [a for held in after.values() for a in held]
    # Nothing of the old pods is left, in the namespace or anywhere.
    everywhere = (get_json(plane, "vnpuallocations", "-A") or {}).get("items", [])
    assert not [a for a in everywhere if a["spec"]["podUID"] in before]
    assert {a["metadata"]["uid"] for a in new_allocations}.isdisjoint(
        a["metadata"]["uid"] for a in old_allocations
    )
    in_namespace = (get_json(plane, "vnpuallocations", "-n", namespace) or {})["items"]
    assert len(in_namespace) == REPLICAS
    for allocation in new_allocations:
        assert allocation["spec"]["nodeName"] == NODE
        assert allocation["metadata"]["labels"][names.LABEL_NODE] == NODE
    # The node holds exactly the new pods' vNPUs: the old ones were destroyed.
    ids = sorted(a["spec"]["vnpuId"] for a in new_allocations)

    def node_holds_the_new_ones() -> bool:
        vnpunode = get_json(plane, "vnpunode", NODE) or {}
        held = sorted(
            v["id"]
            for chip in (vnpunode.get("status") or {}).get("chips") or []
            for v in chip.get("vnpus") or []
        )
        return held == ids

    wait_for(f"VNPUNode {NODE} lists vNPUs {ids} only", node_holds_the_new_ones, timeout=60)
    # No pod create was refused (a refused one is a FailedCreate of its ReplicaSet).
    events = get_json(plane, "events", "-n", namespace, "--field-selector", "reason=FailedCreate")
    assert not (events or {}).get("items"), [e["message"] for e in events["items"]]

    # What the page says not to restore is refused: the pods as exported...
    refused = plane.kubectl(
        "create", "-f", "-", input=json.dumps(exported_pod(old_pods[0])), check=False
    )
    assert refused.returncode != 0
    assert "cannot be used with spec.nodeName" in refused.stderr, refused.stderr
    # ...and their allocations, whoever asks.
    allocation = old_allocations[0]
    restored = {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": allocation["metadata"]["name"],
            "namespace": namespace,
            "labels": allocation["metadata"].get("labels") or {},
        },
        "spec": allocation["spec"],
    }
    refused = plane.kubectl("create", "-f", "-", input=json.dumps(restored), check=False)
    assert refused.returncode != 0
    assert "VNPUAllocations are created by the vnpu-operator only" in refused.stderr
