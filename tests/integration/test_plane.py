"""The local control plane is a real Kubernetes: CRDs, schema validation,
scheduling, finalizers, garbage collection and scheduling gates all behave
as they do in a cluster, which is what the operator's tests rely on."""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import pytest
import yaml

from localplane import LocalPlane, NodeSpec
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane


def _alloc(name: str, **spec_over: Any) -> dict[str, Any]:
    """An allocation as the operator writes it; created as the operator (nobody else may)."""
    spec = {
        "podName": "p",
        "podUID": "uid-1",
        "nodeName": "n1",
        "chip": 0,
        "template": "vir05_1c_16g",
        "vnpuId": 100,
    }
    spec.update(spec_over)
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {"name": name, "labels": {names.LABEL_NODE: spec["nodeName"]}},
        "spec": {k: v for k, v in spec.items() if v is not None},
    }


def _pod(name: str, **spec_extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "tolerations": [{"operator": "Exists"}],
            **spec_extra,
        },
    }


_wait = functools.partial(wait_for, timeout=60, interval=0.25)


def _get(plane: LocalPlane, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    r = plane.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    if r.returncode != 0:
        assert "NotFound" in r.stderr, r.stderr
        return None
    obj: dict[str, Any] = json.loads(r.stdout)
    return obj


def _wait_running(plane: LocalPlane, ns: str, name: str) -> dict[str, Any]:
    def running() -> bool:
        pod = _get(plane, ns, "pod", name)
        return pod is not None and pod["status"].get("phase") == "Running"

    _wait(f"pod {name} Running", running)
    pod = _get(plane, ns, "pod", name)
    assert pod is not None
    return pod


@pytest.fixture(scope="module")
def worker(plane: LocalPlane) -> str:
    """A kwok node for pods to land on."""
    plane.add_nodes([NodeSpec(name="plane-worker-1", chips={"910B3": 2})])
    return "plane-worker-1"


def test_crds_are_established(plane: LocalPlane) -> None:
    out = plane.kubectl("get", "crd", "-o", "json")
    crds = {c["metadata"]["name"]: c for c in json.loads(out.stdout)["items"]}
    for plural in (names.ALLOCATION_PLURAL, names.NODE_PLURAL):
        crd = crds[f"{plural}.{names.GROUP}"]
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds["Established"] == "True"
        assert conds["NamesAccepted"] == "True"
    # The category and short names resolve through discovery.
    assert plane.kubectl("get", names.CATEGORY, "-A").returncode == 0
    assert plane.kubectl("get", names.ALLOCATION_SHORT, "-A").returncode == 0


def test_get_allocations_shows_the_declared_columns(plane: LocalPlane, namespace: str) -> None:
    plane.kubectl(
        "create", "-n", namespace, "-f", "-",
        input=yaml.safe_dump(_alloc("a1", chip=3, vnpuId=148, template="vir10_3c_32g")),
        kubeconfig=plane.operator_kubeconfig,
    )  # fmt: skip
    out = plane.kubectl("get", "vnpuallocations", "-A").stdout.splitlines()
    header = out[0].split()
    assert header == [
        "NAMESPACE", "NAME", "POD", "NODE", "CHIP", "TEMPLATE", "VNPU", "PHASE", "AGE",
    ]  # fmt: skip
    row = next(line.split() for line in out[1:] if line.split()[:2] == [namespace, "a1"])
    assert row[2:7] == ["p", "n1", "3", "vir10_3c_32g", "148"]


def test_get_vnpunodes_shows_the_declared_columns(plane: LocalPlane) -> None:
    node = {
        "apiVersion": names.API_VERSION,
        "kind": names.NODE_KIND,
        "metadata": {"name": "cols-1"},
    }
    plane.kubectl("create", "-f", "-", input=yaml.safe_dump(node))
    status = {
        "status": {
            "driver": "sim",
            "chipCount": 2,
            "vnpuCount": 1,
            "freeAICore": 35,
            "cordoned": "1",
            "unhealthy": "0",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AgentReady",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    }
    plane.kubectl(
        "patch", names.NODE_PLURAL, "cols-1", "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    out = plane.kubectl("get", names.NODE_PLURAL, "cols-1").stdout.splitlines()
    assert out[0].split() == [
        "NAME", "CHIPS", "VNPUS", "FREE-AICORE", "READY", "CORDONED", "UNHEALTHY", "AGE",
    ]  # fmt: skip
    assert out[1].split()[:7] == ["cols-1", "2", "1", "35", "True", "1", "0"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"template": None}, 'spec.template: Required value'),
        ({"vnpuId": 1124}, "spec.vnpuId in body should be less than or equal to 1123"),
        ({"vnpuId": 99}, "spec.vnpuId in body should be greater than or equal to 100"),
        ({"template": "VIR05"}, "spec.template in body should match"),
        ({"chip": -1}, "spec.chip in body should be greater than or equal to 0"),
    ],
)  # fmt: skip
def test_api_server_rejects_invalid_allocations(
    plane: LocalPlane, namespace: str, override: dict[str, Any], message: str
) -> None:
    r = plane.kubectl(
        "create", "-n", namespace, "-f", "-",
        input=yaml.safe_dump(_alloc("bad", **override)), check=False,
        kubeconfig=plane.operator_kubeconfig,
    )  # fmt: skip
    assert r.returncode != 0
    assert message in r.stderr
    assert _get(plane, namespace, names.ALLOCATION_PLURAL, "bad") is None


def test_allocation_spec_is_immutable(plane: LocalPlane, namespace: str) -> None:
    plane.kubectl(
        "create", "-n", namespace, "-f", "-", input=yaml.safe_dump(_alloc("imm")),
        kubeconfig=plane.operator_kubeconfig,
    )  # fmt: skip
    r = plane.kubectl(
        "patch", names.ALLOCATION_PLURAL, "imm", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"vnpuId": 101}}', check=False,
    )  # fmt: skip
    assert r.returncode != 0
    assert "spec is immutable" in r.stderr


def test_status_is_a_subresource(plane: LocalPlane, namespace: str) -> None:
    plane.kubectl(
        "create", "-n", namespace, "-f", "-", input=yaml.safe_dump(_alloc("st")),
        kubeconfig=plane.operator_kubeconfig,
    )  # fmt: skip
    # A status in a main-resource patch is dropped; the subresource sets it.
    plane.kubectl(
        "patch", names.ALLOCATION_PLURAL, "st", "-n", namespace, "--type=merge",
        "-p", '{"status": {"phase": "Ready"}}',
    )  # fmt: skip
    obj = _get(plane, namespace, names.ALLOCATION_PLURAL, "st")
    assert obj is not None
    assert "status" not in obj or "phase" not in obj["status"]
    plane.kubectl(
        "patch", names.ALLOCATION_PLURAL, "st", "-n", namespace, "--type=merge",
        "--subresource=status", "-p", '{"status": {"phase": "Ready"}}',
        kubeconfig=plane.agent_kubeconfig,  # the agents' to write
    )  # fmt: skip
    obj = _get(plane, namespace, names.ALLOCATION_PLURAL, "st")
    assert obj is not None
    assert obj["status"]["phase"] == "Ready"


def test_pod_runs_on_a_kwok_node_through_the_scheduler(
    plane: LocalPlane, namespace: str, worker: str
) -> None:
    # Other tests add nodes to the shared plane; the selector keeps this
    # one deterministic while the scheduler still does the binding.
    pod = _pod("runner", nodeSelector={"kubernetes.io/hostname": worker})
    plane.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    pod = _wait_running(plane, namespace, "runner")
    assert pod["spec"]["nodeName"] == worker
    scheduled = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert scheduled["PodScheduled"] == "True"


def test_finalizer_holds_a_pod_in_terminating(
    plane: LocalPlane, namespace: str, worker: str
) -> None:
    pod = _pod("held")
    pod["metadata"]["finalizers"] = [names.POD_FINALIZER]
    plane.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    _wait_running(plane, namespace, "held")
    plane.kubectl("delete", "pod", "held", "-n", namespace, "--wait=false")
    time.sleep(3)  # kwok completes graceful deletion at once; only the finalizer holds it
    held = _get(plane, namespace, "pod", "held")
    assert held is not None
    assert held["metadata"].get("deletionTimestamp")
    plane.kubectl(
        "patch", "pod", "held", "-n", namespace, "--type=json",
        "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )  # fmt: skip
    _wait("pod gone", lambda: _get(plane, namespace, "pod", "held") is None)


def test_owner_reference_garbage_collects_children(plane: LocalPlane, namespace: str) -> None:
    plane.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = _get(plane, namespace, "configmap", "owner")
    assert owner is not None
    child = _alloc("child")
    child["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    ]
    plane.kubectl(
        "create", "-n", namespace, "-f", "-", input=yaml.safe_dump(child),
        kubeconfig=plane.operator_kubeconfig,
    )  # fmt: skip
    assert _get(plane, namespace, names.ALLOCATION_PLURAL, "child") is not None
    plane.kubectl("delete", "configmap", "owner", "-n", namespace)
    _wait(
        "child collected", lambda: _get(plane, namespace, names.ALLOCATION_PLURAL, "child") is None
    )


def test_scheduling_gate_holds_a_pod_and_affinity_can_be_set_while_gated(
    plane: LocalPlane, namespace: str, worker: str
) -> None:
    pod = _pod("gated", schedulingGates=[{"name": names.SCHEDULING_GATE}])
    plane.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    time.sleep(2)
    gated = _get(plane, namespace, "pod", "gated")
    assert gated is not None
    assert gated["status"]["phase"] == "Pending"
    assert not gated["spec"].get("nodeName")
    cond = {c["type"]: c for c in gated["status"]["conditions"]}
    assert cond["PodScheduled"]["reason"] == "SchedulingGated"

    # While gated, required node affinity may be set where there was none,
    # together with removing the gate: the operator's single pinning patch.
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [worker]}
                        ]
                    }
                ]
            }
        }
    }
    plane.kubectl(
        "patch", "pod", "gated", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"affinity": affinity, "schedulingGates": None}}),
    )  # fmt: skip
    done = _wait_running(plane, namespace, "gated")
    assert done["spec"]["nodeName"] == worker


def test_affinity_cannot_be_changed_once_ungated(
    plane: LocalPlane, namespace: str, worker: str
) -> None:
    """The reason pinning must happen in the same patch that removes the gate."""
    plane.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(_pod("free")))
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [worker]}
                        ]
                    }
                ]
            }
        }
    }
    r = plane.kubectl(
        "patch", "pod", "free", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"affinity": affinity}}), check=False,
    )  # fmt: skip
    assert r.returncode != 0
    assert "Forbidden" in r.stderr or "forbidden" in r.stderr
