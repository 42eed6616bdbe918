"""The chart with `agent.dra=true`, installed by helm on the real kubelet as a
user installs it (issue 54, item 11): the product image's agent pod publishes
the node's pool and registers its kubelet plugin, the scheduler allocates a
device to each pod's claim, the operator replica declares it, and containerd
injects the vNPU by CDI. Each pod sees exactly its own vNPU (`ls /dev` in the
container); the documented uninstall order leaves no vNPU and no slice.

Needs root (the real node, the image build). One release for the module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, RELEASE, helm
from dra_harness import claim_template, limits_deployment
from realnode_harness import exec_in, make_control_devices, ready_for_release, running

from localplane import productimage
from localplane.chart import real_node_values
from localplane.plane import LocalPlane
from localplane.realnode import REAL_NODE_LABEL, TEST_IMAGE, RealNode
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.realnode]

# Not test_real_node_chart's: that module's namespace may still be terminating.
NAMESPACE = "vnpu-realnode-dra"
WORK = "vnpu-realnode-dra-work"
RUNTIME_CLASS = "vnpu-ascend"
TEMPLATE = "vir05_1c_16g"


def _ready(plane: LocalPlane, component: str) -> bool:
    pods = plane.get_json("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}")
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for p in pods["items"]
        for c in (p.get("status") or {}).get("conditions") or []
    )


def _claim_allocs(plane: LocalPlane, node: str) -> list[dict[str, Any]]:
    items = plane.get_json("vnpuallocations", "-A", "-l", f"{names.LABEL_NODE}={node}")["items"]
    return [a for a in items if a["spec"].get("claim")]


def _pool(plane: LocalPlane, node: str) -> list[dict[str, Any]]:
    got = plane.get_json(
        "resourceslices.resource.k8s.io", f"--field-selector=spec.nodeName={node}"
    ) or {"items": []}
    return list(got.get("items", []))


@pytest.fixture(scope="module")
def dra_release(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    workdir = Path(tmp_path_factory.mktemp("realnode-chart-dra"))
    image = productimage.build(progress=lambda line: print(line))
    real_node.import_image(image.archive)
    ready_for_release(plane, real_node, NAMESPACE, WORK)
    # The control devices every CDI spec names (the Ascend driver makes them on a real host).
    make_control_devices(real_node)
    values = real_node_values(
        plane, real_node, image, runtime_class=RUNTIME_CLASS, chips="910B3=1",
        state_dir=workdir / "agent-state", cdi_dir=real_node.cdi_dir,
    )  # fmt: skip
    values["agent"]["dra"] = True
    values["operator"]["replicas"] = 1  # one replica: the claim path, not failover
    (workdir / "values.yaml").write_text(yaml.safe_dump(values))
    installed = False
    try:
        t0 = time.monotonic()
        helm(plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f",
             str(workdir / "values.yaml"))  # fmt: skip
        installed = True
        for component in ("operator", "agent"):
            wait_for(f"the {component} pod Ready", lambda c=component: _ready(plane, c), 180)
        print(f"[realnode-chart-dra] helm install to ready {time.monotonic() - t0:.1f}s")
        yield real_node
        # The documented order: the pods, then their allocations, then helm.
        plane.kubectl("delete", "pods", "--all", "-n", WORK, "--wait=false")
        wait_for("the claims' allocations gone",
                 lambda: not _claim_allocs(plane, real_node.name), 120)  # fmt: skip
        helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s")
        installed = False
        wait_for("the pool gone with the agent", lambda: not _pool(plane, real_node.name), 60)
        assert not list(real_node.device_dir.glob("vdavinci*"))
    finally:
        if installed:
            helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s",
                 check=False)  # fmt: skip
        plane.install_policies()
        plane.kubectl("label", "node", real_node.name, f"{names.LABEL_NPU_NODE}-", check=False)
        for ns in (WORK, NAMESPACE):
            plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _diagnose(plane: LocalPlane, pod: str) -> str:
    """What a pod that never ran was waiting for: its Events, its claim, the
    components' logs."""
    parts = [
        plane.kubectl("describe", "pod", pod, "-n", WORK, check=False).stdout[-3000:],
        plane.kubectl(
            "get", "resourceclaims.resource.k8s.io", "-n", WORK, "-o", "yaml", check=False
        ).stdout[-3000:],
        plane.kubectl("get", "deviceclasses.resource.k8s.io", check=False).stdout,
    ]
    for component in ("operator", "agent"):
        parts.append(plane.kubectl("logs", "-n", NAMESPACE, "-l",
                                   f"app.kubernetes.io/component={component}", "--tail=40",
                                   check=False).stdout)  # fmt: skip
    return "\n---\n".join(parts)


def _claim_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORK},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "terminationGracePeriodSeconds": 2,
            "resourceClaims": [{"name": "npu", "resourceClaimTemplateName": "small"}],
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", 'trap "exit 0" TERM; while true; do sleep 1; done'],
                    "resources": {"claims": [{"name": "npu"}]},
                }
            ],
        },
    }


def test_claim_pods_get_exactly_their_vnpus_from_the_charts_dra_agent(
    plane: LocalPlane, dra_release: RealNode
) -> None:
    node = dra_release
    wait_for("the agent pod's pool", lambda: _pool(plane, node.name), 60)
    vnpunode = plane.get_json("vnpunode", node.name)
    assert vnpunode["status"]["dra"] is True
    plane.apply(claim_template(WORK, "small", TEMPLATE))
    for name in ("dra-a", "dra-b"):
        plane.apply(_claim_pod(name, node.name))
    seen: dict[str, set[str]] = {}
    for name in ("dra-a", "dra-b"):
        try:
            running(plane, WORK, name, timeout=180)
        except AssertionError:
            raise AssertionError(_diagnose(plane, name)) from None
        listing = exec_in(plane, WORK, name, "ls", "/dev").split()
        seen[name] = {d for d in listing if d.startswith("davinci") and d[7:].isdigit()}
    ids = sorted(a["spec"]["vnpuId"] for a in _claim_allocs(plane, node.name))
    assert len(set(ids)) == 2, ids
    assert all(len(s) == 1 for s in seen.values()), seen
    assert {d for s in seen.values() for d in s} == {f"davinci{i}" for i in ids}
    for i in ids:
        assert (node.device_dir / f"vdavinci{i}").exists()


def test_a_deployment_asking_by_limits_gets_exactly_its_vnpu(
    plane: LocalPlane, dra_release: RealNode
) -> None:
    """Issue 55's "done when": limits: {vnpu.io/<template>: 1} in a Deployment, no claim and
    no annotation written by the user; the scheduler's own claim, through the chart's
    DeviceClass for the template, becomes an allocation, and the container sees exactly
    its vNPU. test_one_request runs the same manifest through the annotation path."""
    node = dra_release
    wait_for("the agent pod's pool", lambda: _pool(plane, node.name), 60)
    before = {a["metadata"]["name"] for a in _claim_allocs(plane, node.name)}
    plane.apply(limits_deployment(WORK, "one-request", TEMPLATE, image=TEST_IMAGE,
                                  node_selector={REAL_NODE_LABEL: "true"}))  # fmt: skip

    def the_pod() -> str | None:
        pods = plane.get_json("pods", "-n", WORK, "-l", "app=one-request")["items"]
        return str(pods[0]["metadata"]["name"]) if pods else None

    name = wait_for("the Deployment's pod", the_pod, 60)
    try:
        running(plane, WORK, name, timeout=180)
    except AssertionError:
        raise AssertionError(_diagnose(plane, name)) from None
    pod = plane.get_json("pod", name, "-n", WORK)
    claim_name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    mine = [a for a in _claim_allocs(plane, node.name)
            if a["metadata"]["name"] not in before]  # fmt: skip
    assert [a["spec"]["claim"]["name"] for a in mine] == [claim_name]
    (alloc,) = mine
    assert alloc["spec"]["template"] == TEMPLATE
    listing = exec_in(plane, WORK, name, "ls", "/dev").split()
    seen = {d for d in listing if d.startswith("davinci") and d[7:].isdigit()}
    assert seen == {f"davinci{alloc['spec']['vnpuId']}"}, listing
    plane.kubectl("delete", "deployment", "one-request", "-n", WORK)
    wait_for(
        "the Deployment's allocation released",
        lambda: not [a for a in _claim_allocs(plane, node.name)
                     if a["metadata"]["name"] == alloc["metadata"]["name"]],
        120,
    )  # fmt: skip
