"""The local plane does DRA as the vNPU DRA path needs it (docs/DRA.md): the API server
serves resource.k8s.io/v1 and keeps the fields of partitionable devices, binding
conditions, consumable capacity and device taints; the controller-manager's
resourceclaim controller makes a pod's claim from its template; the scheduler allocates
devices against the pool's shared counters, skips a tainted device, and holds the pod
unbound in PreBind until the allocated device's binding condition is True in the
claim's status; then it binds the pod to the kwok node.

No product code runs here: a test driver (`DRIVER`) publishes by hand what the agent
would, and the test plays the operator's part (the binding condition). The plane's
feature gates are also read from each component's /metrics.

Needs a 1.36+ plane (the main lane); skipped on the 1.34 lane.

Node (prefix `dra-`): dra-a, a kwok node without chips; the pool is named after it.
"""

from __future__ import annotations

import functools
import json
import re
import ssl
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from localplane import LocalPlane, NodeSpec
from localplane.waiting import wait_for

pytestmark = pytest.mark.plane

NODE = "dra-a"
DRIVER = "plane-test.vnpu.io"
CLASS = "dra-plane-test"
READY = f"{DRIVER}/ready"
FAILED = f"{DRIVER}/failed"
TAINT = f"{DRIVER}/unhealthy"
# The gates the DRA path relies on, each on by default from 1.36.
GATES = (
    "DynamicResourceAllocation",
    "DRAPartitionableDevices",
    "DRADeviceBindingConditions",
    "DRAConsumableCapacity",
    "DRADeviceTaints",
)

_wait = functools.partial(wait_for, timeout=60, interval=0.25)


def _counters(aicore: int, memory_mb: int) -> dict[str, Any]:
    return {"aicore": {"value": str(aicore)}, "memory-mb": {"value": str(memory_mb)}}


def _device(name: str, size: str, aicore: int, memory_mb: int, **extra: Any) -> dict[str, Any]:
    """A device of chip 0 that consumes its share of the chip's counter set and binds
    only once the driver says its vNPU is ready."""
    return {
        "name": name,
        "attributes": {"size": {"string": size}},
        "consumesCounters": [{"counterSet": "npu-0", "counters": _counters(aicore, memory_mb)}],
        "bindsToNode": True,
        "bindingConditions": [READY],
        "bindingFailureConditions": [FAILED],
        **extra,
    }


def _pool() -> list[dict[str, Any]]:
    """The node's pool: one slice with the chip's counter set, one with its devices
    (the two may not share a slice). Of the halves, half-0 is tainted."""
    pool = {"name": NODE, "generation": 1, "resourceSliceCount": 2}
    meta = {"labels": {"test": "dra-plane"}}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-counters", **meta},
            "spec": {
                "driver": DRIVER,
                "pool": pool,
                "nodeName": NODE,
                "sharedCounters": [{"name": "npu-0", "counters": _counters(20, 65536)}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-devices", **meta},
            "spec": {
                "driver": DRIVER,
                "pool": pool,
                "nodeName": NODE,
                "devices": [
                    _device("npu-0-whole", "whole", 20, 65536),
                    _device(
                        "npu-0-half-0",
                        "half",
                        10,
                        32768,
                        taints=[{"key": TAINT, "value": "true", "effect": "NoSchedule"}],
                    ),
                    _device("npu-0-half-1", "half", 10, 32768),
                    # Consumable capacity: shared by claims, each taking a slice of it.
                    {
                        "name": "shared-0",
                        "attributes": {"size": {"string": "shared"}},
                        "allowMultipleAllocations": True,
                        "capacity": {"bandwidth": {"value": "100"}},
                    },
                ],
            },
        },
    ]


def _device_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS, "labels": {"test": "dra-plane"}},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def _claim_template(name: str, size: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "npu",
                            "exactly": {
                                "deviceClassName": CLASS,
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": (
                                                f'device.attributes["{DRIVER}"].size == "{size}"'
                                            )
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }


def _pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "npu", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "npu"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _create(plane: LocalPlane, ns: str | None, *objs: dict[str, Any]) -> None:
    where = ["-n", ns] if ns else []
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(objs)})
    plane.kubectl("create", *where, "-f", "-", input=text)


def _get(plane: LocalPlane, *args: str) -> dict[str, Any]:
    obj = plane.get_json(*args)
    assert obj is not None, f"{' '.join(args)} not found"
    return dict(obj)


def _claim_of(plane: LocalPlane, ns: str, pod: str) -> str:
    """The name of the claim the resourceclaim controller made for `pod`."""

    def made() -> str | None:
        statuses = _get(plane, "pod", pod, "-n", ns)["status"].get("resourceClaimStatuses")
        return (statuses or [{}])[0].get("resourceClaimName")

    name: str = _wait(f"the claim of pod {pod}", made)
    return name


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in pod["status"].get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def _enabled_gates(metrics: str) -> dict[str, bool]:
    """kubernetes_feature_enabled{name="X",stage="..."} 1 -> {"X": True}."""
    out = {}
    for m in re.finditer(r"^kubernetes_feature_enabled\{([^}]*)\} (\S+)$", metrics, re.M):
        name = re.search(r'name="([^"]+)"', m.group(1))
        if name:
            out[name.group(1)] = float(m.group(2)) == 1
    return out


def _component_metrics(plane: LocalPlane, port: int) -> str:
    """/metrics of the controller-manager or the scheduler, as the admin (they serve
    self-signed certificates)."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    ctx.load_cert_chain(plane.pki / "admin.crt", plane.pki / "admin.key")
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx) as r:
        return str(r.read().decode())


@pytest.fixture(scope="module")
def dra(plane: LocalPlane) -> Iterator[LocalPlane]:
    minor = int(plane.k8s_version.lstrip("v").split(".")[1])
    if minor < 36:
        pytest.fail(
            f"the DRA path needs Kubernetes 1.36+; this plane is {plane.k8s_version} "
            "(run these on the main lane, without --k8s-lane 1.34)"
        )
    plane.add_nodes([NodeSpec(name=NODE)])
    _create(plane, None, _device_class(), *_pool())
    yield plane
    for kind in ("resourceslice", "deviceclass"):
        plane.kubectl("delete", kind, "-l", "test=dra-plane", "--wait=false", check=False)
    plane.kubectl("delete", "node", NODE, "--wait=false", check=False)


def test_every_component_runs_the_dra_gates(dra: LocalPlane) -> None:
    apiserver = dra.kubectl("get", "--raw", "/metrics").stdout
    components = {
        "kube-apiserver": apiserver,
        "kube-controller-manager": _component_metrics(dra, dra.ports.controller_manager),
        "kube-scheduler": _component_metrics(dra, dra.ports.scheduler),
    }
    for component, metrics in components.items():
        gates = _enabled_gates(metrics)
        off = [g for g in GATES if not gates.get(g)]
        assert not off, f"{component} runs without {off}"
    served = json.loads(dra.kubectl("get", "--raw", "/apis/resource.k8s.io").stdout)
    assert "v1" in [v["version"] for v in served["versions"]]


def test_the_api_server_keeps_every_dra_field(dra: LocalPlane) -> None:
    """A gate that is off makes the API server drop its fields silently."""
    counters = _get(dra, "resourceslice", f"{NODE}-counters")["spec"]
    assert counters["sharedCounters"][0]["name"] == "npu-0"
    devices = {
        d["name"]: d for d in _get(dra, "resourceslice", f"{NODE}-devices")["spec"]["devices"]
    }
    half = devices["npu-0-half-0"]
    assert half["consumesCounters"][0]["counterSet"] == "npu-0"
    assert half["bindsToNode"] is True
    assert half["bindingConditions"] == [READY]
    assert half["bindingFailureConditions"] == [FAILED]
    assert half["taints"][0]["key"] == TAINT
    assert devices["shared-0"]["allowMultipleAllocations"] is True


def test_a_claim_waits_for_its_binding_condition_then_the_pod_binds(
    dra: LocalPlane, namespace: str
) -> None:
    ns = namespace
    _create(dra, ns, _claim_template("half", "half"), _claim_template("whole", "whole"))
    _create(dra, ns, _pod("half", "half"))
    claim_name = _claim_of(dra, ns, "half")

    # Allocated: the untainted half, on the pool's node, with the binding conditions.
    def allocated() -> dict[str, Any] | None:
        status = _get(dra, "resourceclaim", claim_name, "-n", ns).get("status") or {}
        return status.get("allocation")

    allocation = _wait("the claim allocated", allocated)
    (result,) = allocation["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (DRIVER, NODE, "npu-0-half-1")
    assert result["bindingConditions"] == [READY]
    assert result["bindingFailureConditions"] == [FAILED]
    terms = allocation["nodeSelector"]["nodeSelectorTerms"]
    assert NODE in json.dumps(terms)

    # The scheduler holds the pod in PreBind: allocated, reserved, not bound.
    claim = _get(dra, "resourceclaim", claim_name, "-n", ns)
    assert [r["name"] for r in claim["status"].get("reservedFor") or []] == ["half"]
    for _ in range(6):
        pod = _get(dra, "pod", "half", "-n", ns)
        assert not pod["spec"].get("nodeName"), "bound before its device was ready"
        time.sleep(0.5)

    # The chip's counters are half spent: the whole chip fits no more, so a pod
    # asking for it is unschedulable.
    _create(dra, ns, _pod("whole", "whole"))

    def unschedulable() -> bool:
        cond = _condition(_get(dra, "pod", "whole", "-n", ns), "PodScheduled")
        return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"

    _wait("pod whole unschedulable", unschedulable)

    # The driver reports the vNPU ready: the scheduler binds the pod, kwok runs it.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "status": {
            "devices": [
                {
                    "driver": DRIVER,
                    "pool": NODE,
                    "device": "npu-0-half-1",
                    "conditions": [
                        {
                            "type": READY,
                            "status": "True",
                            "reason": "VNPUCreated",
                            "message": "",
                            "lastTransitionTime": now,
                        }
                    ],
                }
            ]
        }
    }
    dra.kubectl(
        "patch", "resourceclaim", claim_name, "-n", ns, "--subresource=status",
        "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip

    def running() -> dict[str, Any] | None:
        pod = _get(dra, "pod", "half", "-n", ns)
        return pod if pod["status"].get("phase") == "Running" else None

    pod = _wait("pod half Running", running)
    assert pod["spec"]["nodeName"] == NODE
    whole = _get(dra, "pod", "whole", "-n", ns)
    assert not whole["spec"].get("nodeName")
