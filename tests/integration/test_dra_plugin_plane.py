"""The DRA kubelet plugin against the real API server: a gRPC client acting
as the kubelet calls NodePrepareResources, and the plugin reads the
ResourceClaim (resource.k8s.io/v1) and the VNPUAllocations from the API
server (vnpu_agent.dra.prepare.ApiClaimReader, as the agent's identity).

No scheduler allocates here: the claim's status.allocation is written by the
admin as the scheduler would, and the allocation's status as the agent
would, so the test needs only a plane that serves resource.k8s.io/v1
(Kubernetes 1.34 and later). The kubelet's own calls are the real-node
lane's (tests/integration/test_real_node_dra.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from dra_harness import resource_claim
from kubernetes_asyncio import config

from localplane import LocalPlane
from vnpu_agent.dra.plugin import KubeletPlugin, sockets
from vnpu_agent.dra.prepare import ApiClaimReader, Preparer
from vnpu_agent.dra.protos.dra.v1 import api_pb2 as dra_pb2
from vnpu_agent.dra.protos.dra.v1 import api_pb2_grpc as dra_grpc
from vnpu_agent.dra.protos.drahealth.v1 import api_pb2 as health_pb2
from vnpu_agent.dra.protos.drahealth.v1 import api_pb2_grpc as health_grpc
from vnpu_common.wire import names

# k8s134: also run on the 1.34 lane (`make test-k8s134`): the ResourceClaim's shape is the
# API server's.
pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

NODE = "dra-plugin-node"
DEVICE = "npu-0-vir05-1c-16g-0"
OTHER = "npu-0-vir05-1c-16g-1"


def _allocate(plane: LocalPlane, namespace: str, name: str, device: str) -> str:
    """Creates the claim and writes its allocation as the scheduler would;
    returns its UID."""
    plane.apply(resource_claim(namespace, name))
    status = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "npu",
                            "driver": names.DRA_DRIVER,
                            "pool": NODE,
                            "device": device,
                        }
                    ]
                }
            }
        }
    }
    plane.kubectl(
        "patch", "resourceclaims.resource.k8s.io", name, "-n", namespace,
        "--subresource=status", "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip
    out = plane.kubectl(
        "get", "resourceclaims.resource.k8s.io", name, "-n", namespace, "-o", "json"
    ).stdout
    obj = json.loads(out)
    assert obj["status"]["allocation"]["devices"]["results"][0]["device"] == device
    uid: str = obj["metadata"]["uid"]
    return uid


def _declare(
    plane: LocalPlane, namespace: str, claim: str, uid: str, device: str, vnpu_id: int, phase: str
) -> None:
    """The VNPUAllocation the operator writes for the device, with the status
    the agent writes."""
    name = names.dra_allocation_name(uid, device)
    manifest = yaml.safe_dump(
        {
            "apiVersion": names.API_VERSION,
            "kind": names.ALLOCATION_KIND,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {names.LABEL_NODE: NODE, names.LABEL_CLAIM_UID: uid},
            },
            "spec": {
                "podName": "p",
                "podUID": "pod-uid",
                "nodeName": NODE,
                "chip": 0,
                "template": "vir05_1c_16g",
                "vnpuId": vnpu_id,
                "claim": {"name": claim, "uid": uid, "request": "npu", "device": device},
            },
        }
    )
    # As the operator and the agent: the plane's protection policies let no one else.
    plane.kubectl(
        "apply", "--server-side", "-f", "-", input=manifest, kubeconfig=plane.operator_kubeconfig
    )
    status: dict[str, Any] = {"phase": phase}
    if phase != names.PHASE_READY:
        status["message"] = "creating vNPU failed: chip 0 is full"
    plane.kubectl(
        "patch", f"{names.ALLOCATION_PLURAL}.{names.GROUP}", name, "-n", namespace,
        "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}),
        kubeconfig=plane.agent_kubeconfig,
    )  # fmt: skip


@pytest.fixture
def sock_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # unix paths: 107 bytes at most
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def test_prepare_reads_the_claim_and_its_allocation_from_the_api(
    plane: LocalPlane, namespace: str, sock_root: Path, tmp_path: Path
) -> None:
    ready_uid = _allocate(plane, namespace, "ready", DEVICE)
    _declare(plane, namespace, "ready", ready_uid, DEVICE, 101, names.PHASE_READY)
    failed_uid = _allocate(plane, namespace, "failed", OTHER)
    _declare(plane, namespace, "failed", failed_uid, OTHER, 102, names.PHASE_FAILED)
    pending_uid = _allocate(plane, namespace, "undeclared", DEVICE)

    api_client = await config.new_client_from_config(config_file=str(plane.agent_kubeconfig))
    preparer = Preparer(
        NODE, ApiClaimReader(api_client), tmp_path / "checkpoint.json", tmp_path / "cdi"
    )
    paths = sockets(names.DRA_DRIVER, sock_root / "plugins", sock_root / "registry", "pod")
    plugin = KubeletPlugin(names.DRA_DRIVER, preparer, paths, chip_health=lambda: {0: True})
    await plugin.start()
    channel = grpc.aio.insecure_channel(f"unix://{paths.dra}")
    try:
        kubelet = dra_grpc.DRAPluginStub(channel)
        claims = [
            dra_pb2.Claim(namespace=namespace, name="ready", uid=ready_uid),
            dra_pb2.Claim(namespace=namespace, name="failed", uid=failed_uid),
            dra_pb2.Claim(namespace=namespace, name="undeclared", uid=pending_uid),
            # The claim was deleted and created again since the kubelet looked.
            dra_pb2.Claim(namespace=namespace, name="ready", uid="0000-stale"),
        ]
        answer = await kubelet.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=claims), timeout=45
        )
        assert set(answer.claims) == {ready_uid, failed_uid, pending_uid, "0000-stale"}

        ready = answer.claims[ready_uid]
        assert ready.error == ""
        (device,) = ready.devices
        assert (device.pool_name, device.device_name) == (NODE, DEVICE)
        assert list(device.request_names) == ["npu"]
        assert list(device.cdi_device_ids) == [f"vnpu.io/claim={ready_uid}-{DEVICE}"]
        spec = json.loads(
            (tmp_path / "cdi" / f"vnpu.io-claim-{ready_uid}-{DEVICE}.json").read_text()
        )
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        assert nodes[0] == {"path": "/dev/davinci101", "hostPath": "/dev/vdavinci101"}

        assert "is Failed, not Ready: creating vNPU failed: chip 0 is full" in (
            answer.claims[failed_uid].error
        )
        assert "not found (the operator has not written it yet)" in (
            answer.claims[pending_uid].error
        )
        assert f"has UID {ready_uid}, not 0000-stale" in answer.claims["0000-stale"].error
        assert preparer.is_prepared(ready_uid)
        assert not preparer.is_prepared(failed_uid)

        # The health stream names the prepared device, and only it.
        stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        report = await asyncio.wait_for(stream.read(), timeout=5)
        assert [
            (d.device.pool_name, d.device.device_name, health_pb2.HealthStatus.Name(d.health))
            for d in report.devices
        ] == [(NODE, DEVICE, "HEALTHY")]
        stream.cancel()

        undone = await kubelet.NodeUnprepareResources(
            dra_pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=45
        )
        assert undone.claims[ready_uid].error == ""
        assert not list((tmp_path / "cdi").glob("*.json"))
    finally:
        await channel.close()
        await plugin.stop(grace=0)
        await api_client.close()
