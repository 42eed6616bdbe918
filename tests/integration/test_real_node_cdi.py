"""The agent's CDI specs, consumed for real: containerd on the real node
injects a vNPU's spec into a container when the container's CRI config names
the device, which the test device plugin (hack/node/cdi-test-plugin) makes
the kubelet do. Also, with the Ascend runtime stand-in instead of CDI: the
annotation path's env names a container's vNPUs by CANN's indexes.

The agent (sim driver, serving the real node) makes the vNPU and its device
node in the node's device dir, and writes the spec into containerd's only
CDI spec directory with host paths in that device dir
(--cdi-host-device-dir). Nothing of the operator runs: allocations are made
by hand, as the operator would.

The node is conftest's module-scoped `real_node`. Needs root; without it the
fixture fails with RealNodeError saying so.
`make test-realnode` runs these (marker `realnode`).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import allocation, create, phase
from operator_harness import purge_foreign
from realnode_harness import make_control_devices, release_node_allocations

from localplane.components import AGENT_NAMESPACE, AgentProcess
from localplane.plane import LocalPlane
from localplane.realnode import ASCEND_HANDLER, TEST_IMAGE, RealNode
from localplane.waiting import wait_for
from vnpu_agent import cdi
from vnpu_agent.drivers.sim import NULL_DEVICE
from vnpu_common.wire import names
from vnpu_operator.admission.mutation import device_env

pytestmark = [pytest.mark.plane, pytest.mark.realnode]

# Stand-ins for the Ascend control devices: harmless character devices
# (/dev/zero, /dev/full, /dev/urandom) with numbers of their own, so that a
# container seeing the right numbers saw the right node.


@pytest.fixture(scope="module")
def cdi_agent(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    """A sim agent for the real node (one 910B3 chip) whose vNPUs get a
    device node in the node's device dir and a CDI spec in containerd's spec
    dir, naming host paths in that device dir."""
    if plane.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode != 0:
        plane.kubectl("create", "namespace", AGENT_NAMESPACE)
    make_control_devices(real_node)
    dev = real_node.device_dir
    purge_foreign(plane, [real_node.name])
    agent = AgentProcess(
        plane,
        Path(tmp_path_factory.mktemp("cdi-agent")),
        [real_node.name],
        extra=[
            "--sim-chips=910B3=1",
            f"--sim-device-dir={dev}",
            f"--cdi-host-device-dir={dev}",
            # After the harness's own --cdi-dir: the last one wins.
            f"--cdi-dir={real_node.cdi_dir}",
        ],
    )
    agent.start()
    wait_for("VNPUNode published", lambda: plane.get_json("vnpunode", real_node.name), 30)
    try:
        yield agent
    finally:
        try:
            # The agent destroys what is left and lets the allocations go.
            release_node_allocations(plane, real_node)
        finally:
            agent.kill(signal.SIGTERM)
            plane.kubectl("delete", "vnpunode", real_node.name, "--wait=false", check=False)
            plane.kubectl(
                "delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(real_node.name),
                check=False,
            )  # fmt: skip


def _make_vnpu(plane: LocalPlane, node: RealNode, namespace: str, vnpu_id: int) -> Path:
    """An allocation for `vnpu_id` on the real node, as the operator writes
    it; returns the spec path once the agent reports it Ready."""
    name = f"cdi-{vnpu_id}"
    create(plane, namespace, allocation(name, node=node.name, vnpu_id=vnpu_id))
    wait_for(
        f"allocation {name} Ready",
        lambda: phase(plane, namespace, name) == names.PHASE_READY,
        30,
    )
    spec = cdi.spec_path(node.cdi_dir, node.name, vnpu_id)
    assert spec.exists(), f"the agent wrote no CDI spec at {spec}"
    return spec


def _pod(node: RealNode, namespace: str, resource: str) -> dict[str, Any]:
    """A plain pod (no vNPU annotation) that asks the test device plugin for
    one device of `resource`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"cdi-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", 'trap "exit 0" TERM; while true; do sleep 1; done'],
                    "resources": {"limits": {resource: "1"}},
                }
            ],
        },
    }


def _running(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = plane.get_json("pod", name, "-n", namespace) or {}
        if pod.get("status", {}).get("phase") == "Running":
            return dict(pod)
        waiting = [
            s["state"]["waiting"]
            for s in pod.get("status", {}).get("containerStatuses") or []
            if "waiting" in s.get("state", {})
        ]
        # Fail at once, with containerd's reason, rather than time out.
        assert not [w for w in waiting if w.get("reason") == "CreateContainerError"], waiting
        return None

    result: dict[str, Any] = wait_for(f"pod {name} Running", check, 60, interval=0.2)
    return result


def _create_error(plane: LocalPlane, namespace: str, name: str) -> str:
    """The kubelet's message for a container that could not be created."""

    def check() -> str | None:
        pod = plane.get_json("pod", name, "-n", namespace) or {}
        for s in pod.get("status", {}).get("containerStatuses") or []:
            waiting = s.get("state", {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerError":
                assert "running" not in s["state"]
                return str(waiting.get("message", ""))
        return None

    message: str = wait_for(f"pod {name} CreateContainerError", check, 60, interval=0.2)
    return message


def _events(plane: LocalPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    out = plane.get_json(
        "events", "-n", namespace, f"--field-selector=involvedObject.name={name}"
    ) or {"items": []}
    items: list[dict[str, Any]] = out["items"]
    return items


def _stat(plane: LocalPlane, namespace: str, name: str, *paths: str) -> dict[str, str]:
    """Type and major:minor (hex, as stat(1) prints them) of paths in the container."""
    out = plane.kubectl(
        "exec", "-n", namespace, name, "--", "stat", "-c", "%n|%F|%t:%T", *paths
    ).stdout
    return {
        n: f"{kind}|{numbers}"
        for n, kind, numbers in (ln.split("|") for ln in out.split("\n") if ln)
    }


def _host(path: Path) -> str:
    st = os.stat(path)
    assert stat.S_ISCHR(st.st_mode), f"{path} is not a character device"
    return f"character special file|{os.major(st.st_rdev):x}:{os.minor(st.st_rdev):x}"


def test_containerd_injects_the_agents_spec_for_a_device_plugins_request(
    plane: LocalPlane, real_node: RealNode, cdi_agent: AgentProcess, namespace: str
) -> None:
    vnpu_id = 104
    spec_file = _make_vnpu(plane, real_node, namespace, vnpu_id)
    spec = json.loads(spec_file.read_text())
    nodes = {n["path"]: n["hostPath"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]}
    dev = real_node.device_dir
    assert nodes[f"/dev/davinci{vnpu_id}"] == str(dev / f"vdavinci{vnpu_id}")
    assert (dev / f"vdavinci{vnpu_id}").exists()

    t0 = time.monotonic()
    resource = real_node.start_cdi_test_plugin("present", [vnpu_id])
    print(f"[realnode] test device plugin registered and allocatable: {time.monotonic() - t0:.2f}s")
    manifest = _pod(real_node, namespace, resource)
    name = manifest["metadata"]["name"]
    t1 = time.monotonic()
    plane.apply(manifest)
    _running(plane, namespace, name)
    print(f"[realnode] CDI pod create -> Running: {time.monotonic() - t1:.2f}s")

    # Every device node of the spec, at its container path, is the host node
    # it names (type and numbers, taken by containerd's CDI library from the
    # host path at injection).
    seen = _stat(plane, namespace, name, *nodes)
    assert seen == {path: _host(Path(host)) for path, host in nodes.items()}
    assert seen[f"/dev/davinci{vnpu_id}"].endswith(f"|{NULL_DEVICE[0]:x}:{NULL_DEVICE[1]:x}")
    # Nothing else of the kind: only the requested vNPU.
    listing = plane.kubectl("exec", "-n", namespace, name, "--", "ls", "/dev").stdout.split()
    assert [d for d in listing if d.startswith("davinci") and d[7:].isdigit()] == [
        f"davinci{vnpu_id}"
    ]
    # The spec's environment came with it.
    env = plane.kubectl("exec", "-n", namespace, name, "--", "env").stdout.splitlines()
    assert f"{names.ENV_VISIBLE_DEVICES}={vnpu_id}" in env
    assert f"{names.ENV_RUNTIME_OPTIONS}={names.RUNTIME_OPTIONS_VIRTUAL}" in env
    # And it was the plugin's answer that asked for it.
    log = plane.log_tail("cdi-test-plugin-present")
    assert f"allocate [{vnpu_id}]" in log
    assert f"vnpu.io/vnpu={vnpu_id}" in log


def test_a_vnpu_without_a_spec_fails_the_create_with_containerds_cdi_error(
    plane: LocalPlane, real_node: RealNode, cdi_agent: AgentProcess, namespace: str
) -> None:
    """1100 is a valid vNPU id that no allocation made: the agent wrote no
    spec for it, so containerd cannot resolve the name the plugin gives."""
    assert not list(real_node.cdi_dir.glob("*vnpu1100.json"))
    resource = real_node.start_cdi_test_plugin("absent", [1100])
    manifest = _pod(real_node, namespace, resource)
    name = manifest["metadata"]["name"]
    plane.apply(manifest)
    message = _create_error(plane, namespace, name)
    print(f"[realnode] CDI create error: {message}")
    assert "CDI device injection failed: unresolvable CDI devices vnpu.io/vnpu=1100" in message
    events = _events(plane, namespace, name)
    assert any(
        e["reason"] == "Failed" and "unresolvable CDI devices vnpu.io/vnpu=1100" in e["message"]
        for e in events
    ), [(e["reason"], e["message"]) for e in events]
    pod = plane.get_json("pod", name, "-n", namespace)
    assert pod["status"]["phase"] == "Pending"


def test_the_spec_goes_with_the_vnpu(
    plane: LocalPlane, real_node: RealNode, cdi_agent: AgentProcess, namespace: str
) -> None:
    """Once the allocation is gone, the agent has destroyed the vNPU and
    removed its spec, and containerd no longer injects it."""
    vnpu_id = 105
    spec_file = _make_vnpu(plane, real_node, namespace, vnpu_id)
    resource = real_node.start_cdi_test_plugin("released", [vnpu_id])
    first = _pod(real_node, namespace, resource)
    plane.apply(first)
    _running(plane, namespace, first["metadata"]["name"])
    plane.kubectl("delete", "pod", "-n", namespace, first["metadata"]["name"], "--wait=true",
                  timeout=60)  # fmt: skip

    plane.kubectl("delete", "vnpuallocation", "-n", namespace, f"cdi-{vnpu_id}", "--wait=true",
                  timeout=60)  # fmt: skip
    assert not spec_file.exists()
    assert not (real_node.device_dir / f"vdavinci{vnpu_id}").exists()
    again = _pod(real_node, namespace, resource)
    plane.apply(again)
    message = _create_error(plane, namespace, again["metadata"]["name"])
    assert f"unresolvable CDI devices vnpu.io/vnpu={vnpu_id}" in message


def test_an_annotation_containers_env_gives_cann_the_indexes_of_non_first_vnpus(
    plane: LocalPlane, real_node: RealNode, cdi_agent: AgentProcess, namespace: str
) -> None:
    """The annotation path's env (the webhook's device_env for a pod of two
    vNPUs; ASCEND_VISIBLE_DEVICES read from vnpu.io/visible-devices as the
    operator sets it, in its order) under the Ascend runtime stand-in: the
    runtime mounts vNPUs 106 and 103, neither the chip's first, and CANN's
    indexes are 0,1 whatever the image said (an earlier entry here, which the
    kubelet's last-one-wins puts where an image's ENV is)."""
    for vnpu_id in (106, 103):
        _make_vnpu(plane, real_node, namespace, vnpu_id)
    pod = _pod(real_node, namespace, "unused")
    pod["metadata"]["annotations"] = {names.ANN_VISIBLE_DEVICES: "106,103"}
    pod["spec"]["runtimeClassName"] = ASCEND_HANDLER
    (main,) = pod["spec"]["containers"]
    del main["resources"]
    main["env"] = [{"name": names.ENV_RT_VISIBLE_DEVICES, "value": "106"}, *device_env(True, 2)]
    name = pod["metadata"]["name"]
    # Not server-side apply: it refuses an env name twice, which the kubelet takes.
    plane.kubectl("create", "-f", "-", input=json.dumps(pod))
    _running(plane, namespace, name)

    listing = plane.kubectl("exec", "-n", namespace, name, "--", "ls", "/dev").stdout.split()
    assert sorted(d for d in listing if d.startswith("davinci") and d[7:].isdigit()) == [
        "davinci103",
        "davinci106",
    ]
    env = plane.kubectl("exec", "-n", namespace, name, "--", "env").stdout.splitlines()
    assert f"{names.ENV_VISIBLE_DEVICES}=106,103" in env
    assert f"{names.ENV_RT_VISIBLE_DEVICES}=0,1" in env
    assert [e for e in env if e.startswith(f"{names.ENV_RT_VISIBLE_DEVICES}=")] == [
        f"{names.ENV_RT_VISIBLE_DEVICES}=0,1"
    ]
    plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=true", timeout=60)
