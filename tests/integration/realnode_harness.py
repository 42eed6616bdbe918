"""Helpers of the tests on the real node (test_real_node*.py): starting the node,
busybox pods that ask for vNPUs, and what their containers see."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chart_harness import adopt_crds
from operator_harness import delete_vnpu_pods, pod_running, purge_foreign

from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess
from localplane.plane import LocalPlane
from localplane.pods import vnpu_pod
from localplane.policies import ASCEND_RUNTIME_CLASS
from localplane.realnode import TEST_IMAGE, RealNode, RealNodeError
from localplane.waiting import wait_for
from vnpu_common.wire import names

# How long a test run waits for another run's real node (one per machine) to stop
# before it fails; 0: at once. For machines where several runs share the node.
LOCK_WAIT_ENV = "VNPU_REALNODE_WAIT_SECONDS"
LOCK_POLL_SECONDS = 30.0

# PID 1 without a trap ignores SIGTERM; the kubelet kills it after the grace period.
SLEEP = "exec sleep 3600"
SHOW = 'echo "env=$ASCEND_VISIBLE_DEVICES"; ls /dev'


def start_real_node(plane: LocalPlane) -> RealNode:
    """A started real node on `plane`; waits up to $VNPU_REALNODE_WAIT_SECONDS for
    another run's node to stop."""
    deadline = time.monotonic() + float(os.environ.get(LOCK_WAIT_ENV, "0") or 0)
    while True:
        node = RealNode(plane)
        try:
            node.start(progress=lambda msg: print(f"[realnode] {msg}"))
        except RealNodeError as exc:
            if "already runs on this machine" not in str(exc) or time.monotonic() > deadline:
                raise
            print(f"[realnode] {exc}; retrying in {LOCK_POLL_SECONDS:.0f}s")
            time.sleep(LOCK_POLL_SECONDS)
            continue
        print(f"[realnode] timings: {node.timings}")
        return node


@contextlib.contextmanager
def serving_vnpus(
    plane: LocalPlane, real_node: RealNode, workdir: Path, chips: str = "910B3=1"
) -> Iterator[RealNode]:
    """The operator (webhook applying RuntimeClass `ascend`) and a sim agent
    serving the real node, its chips (`sim.vnpu.io/chips` syntax) from the node
    annotation and a device node per vNPU in the node's device dir. On exit every
    vNPU pod is deleted and waited for, then both processes stop."""
    if plane.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode != 0:
        plane.kubectl("create", "namespace", AGENT_NAMESPACE)
    plane.kubectl("annotate", "node", real_node.name, f"{names.ANN_SIM_CHIPS}={chips}",
                  "--overwrite")  # fmt: skip
    # A control device the real runtime adds when the host has it.
    real_node.add_davinci_manager()
    purge_foreign(plane, [real_node.name])
    agent = AgentProcess(
        plane, workdir / "agent", [real_node.name],
        extra=[f"--sim-device-dir={real_node.device_dir}"],
    )  # fmt: skip
    operator = OperatorProcess(
        plane, workdir / "operator", extra=[f"--runtime-class-name={ASCEND_RUNTIME_CLASS}"]
    )
    agent.start()
    wait_for("VNPUNode published", lambda: plane.get_json("vnpunode", real_node.name), 30)
    operator.start()
    try:
        yield real_node
    finally:
        try:
            delete_vnpu_pods(plane)
        finally:
            operator.kill(signal.SIGTERM)
            agent.kill(signal.SIGTERM)
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)
            plane.kubectl("delete", "vnpunode", real_node.name, "--wait=false", check=False)
            plane.kubectl(
                "delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(real_node.name),
                check=False,
            )  # fmt: skip
            plane.kubectl("annotate", "node", real_node.name, f"{names.ANN_SIM_CHIPS}-",
                          check=False)  # fmt: skip


def running(plane: LocalPlane, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    """The pod once its phase is Running, looked at every 0.1 s: the real-node
    tests print how long a pod took to get there."""
    return pod_running(plane, namespace, name, timeout=timeout, interval=0.1)


def exec_in(plane: LocalPlane, namespace: str, name: str, *cmd: str) -> str:
    """`kubectl exec` in the pod's first container; its stdout."""
    return plane.kubectl("exec", "-n", namespace, name, "--", *cmd).stdout


def vnpu_busybox_pod(name: str, namespace: str, count: int, **spec: Any) -> dict[str, Any]:
    """A pod asking for `count` vir05_1c_16g vNPUs, with an init container that
    prints what it sees and a main container that sleeps (2 s grace period)."""
    pod = vnpu_pod(name, namespace, template="vir05_1c_16g", count=count,
                   spec={"terminationGracePeriodSeconds": 2, **spec})  # fmt: skip
    container = {"image": TEST_IMAGE, "imagePullPolicy": "Never"}
    pod["spec"]["initContainers"] = [{"name": "init", **container, "command": ["sh", "-c", SHOW]}]
    pod["spec"]["containers"] = [{"name": "main", **container, "command": ["sh", "-c", SLEEP]}]
    return pod


def davinci(listing: str) -> set[str]:
    """The davinci<id> names in an `ls` listing."""
    return {d for d in listing.split() if d.startswith("davinci") and d[7:].isdigit()}


def allocation_ids(plane: LocalPlane, namespace: str, pod: dict[str, Any]) -> list[int]:
    allocs = plane.get_json("vnpuallocations", "-n", namespace,
                            "-l", f"{names.LABEL_POD_UID}={pod['metadata']['uid']}")  # fmt: skip
    return sorted(a["spec"]["vnpuId"] for a in allocs["items"])


def check_devices(plane: LocalPlane, namespace: str, pod: dict[str, Any]) -> list[int]:
    """What the containers of a vnpu_busybox_pod see: the allocation's ids in the
    env and exactly their device nodes, in the main and the init container.
    Returns the ids."""
    name = pod["metadata"]["name"]
    ids = allocation_ids(plane, namespace, pod)
    shown = pod["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES]
    assert sorted(int(i) for i in shown.split(",")) == ids
    wanted = {f"davinci{i}" for i in ids}
    env = exec_in(plane, namespace, name, "sh", "-c", f"echo ${names.ENV_VISIBLE_DEVICES}").strip()
    assert env == shown
    listing = exec_in(plane, namespace, name, "ls", "/dev")
    assert davinci(listing) == wanted
    assert "davinci_manager" in listing.split()
    init_log = plane.kubectl("logs", "-n", namespace, name, "-c", "init").stdout
    assert f"env={shown}" in init_log.splitlines()
    assert davinci(init_log) == wanted
    return ids


# The Ascend control devices every vNPU container gets beside its vNPU, made in
# the node's device dir as character devices of fixed numbers.
CONTROL_DEVICES = {"davinci_manager": (1, 5), "devmm_svm": (1, 7), "hisi_hdc": (1, 9)}


def make_control_devices(real_node: RealNode) -> None:
    dev = real_node.device_dir
    dev.mkdir(parents=True, exist_ok=True)
    for name, numbers in CONTROL_DEVICES.items():
        (dev / name).unlink(missing_ok=True)
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(*numbers))


def release_node_allocations(plane: LocalPlane, real_node: RealNode) -> None:
    """Deletes every allocation of the real node, waiting for each, while its
    agent still runs: the agent destroys the vNPUs and lets the allocations go."""
    for alloc in (plane.get_json("vnpuallocations", "-A") or {}).get("items", []):
        meta = alloc["metadata"]
        if (meta.get("labels") or {}).get(names.LABEL_NODE) == real_node.name:
            plane.kubectl("delete", "vnpuallocation", "-n", meta["namespace"],
                          meta["name"], "--wait=true", timeout=60, check=False)  # fmt: skip


def ready_for_release(plane: LocalPlane, real_node: RealNode, *namespaces: str) -> None:
    """The shared plane made ready for a chart release serving the real node,
    whose namespace comes first in `namespaces`: an earlier agent's device
    nodes and a local operator's webhooks and allocations go, the node is an
    NPU node, the namespaces exist, the CRDs are the release's, and the plane's
    own protection policies make way for the release's."""
    for stale in real_node.device_dir.glob("vdavinci*"):
        stale.unlink()
    purge_foreign(plane, [real_node.name])
    plane.kubectl("label", "node", real_node.name, f"{names.LABEL_NPU_NODE}=true", "--overwrite")
    for ns in namespaces:
        if plane.kubectl("get", "namespace", ns, check=False).returncode != 0:
            plane.kubectl("create", "namespace", ns)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, "--ignore-not-found")
    adopt_crds(plane, namespaces[0])
    plane.remove_policies()
