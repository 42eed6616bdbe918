"""The DRA kubelet plugin, called by a real kubelet: the agent (sim driver,
--dra, serving the real node by --node-name as the DaemonSet does) registers
its plugin in the kubelet's plugin registry; the kubelet prepares a pod's
ResourceClaim through it, and containerd injects the CDI spec the plugin
wrote: the container sees /dev/davinci<id>. The vNPU of a deleted allocation
stays while the claim is prepared, and goes once the kubelet unprepares it.

No scheduler and no operator: the claim's allocation and reservation are
written as the scheduler would, the VNPUAllocation as the operator would, and
the pod names its node. Needs the real node's kubelet to speak DRA v1
(Kubernetes 1.34 and later; the lane runs the plane's version). Needs root.
`make test-realnode` runs these (marker `realnode`).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import allocation, create, get_alloc, phase
from dra_harness import claim_template, device_class, resource_claim
from operator_harness import purge_foreign
from realnode_harness import exec_in, make_control_devices, release_node_allocations, running

from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess, flags, free_port
from localplane.plane import LocalPlane, PlaneError
from localplane.realnode import ASCEND_HANDLER, KUBELET_ROOT, TEST_IMAGE, RealNode
from localplane.waiting import wait_for
from vnpu_agent import cdi
from vnpu_agent.dra import metadata
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.realnode]

TEMPLATE = "vir05_1c_16g"
DEVICE = names.dra_device_name(0, TEMPLATE, 0)
VNPU_ID = 105
REGISTRATION = KUBELET_ROOT / "plugins_registry" / f"{names.DRA_DRIVER}-reg.sock"


class OwnNodeAgent(AgentProcess):
    """The agent as the DaemonSet runs it: --node-name, not --simulate-nodes
    (an agent simulating nodes serves no kubelet plugin)."""

    def start(
        self, *, env: dict[str, str] | None = None, ready_timeout: float = 30
    ) -> AgentProcess:
        self.port = free_port()
        (node,) = self.nodes
        args = [
            f"--kubeconfig={self.plane.agent_kubeconfig}",
            f"--node-name={node}",
            f"--state-dir={self.state_dir}",
            f"--agent-namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.port}",
            *flags(self.settings),
            *self.extra,
        ]
        self.launch(args, {**self.plane.env(), **(env or {})}, ready_timeout=ready_timeout)
        return self


@pytest.fixture(scope="module")
def dra_agent(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    if plane.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode != 0:
        plane.kubectl("create", "namespace", AGENT_NAMESPACE)
    make_control_devices(real_node)
    dev = real_node.device_dir
    purge_foreign(plane, [real_node.name])
    agent = OwnNodeAgent(
        plane,
        Path(tmp_path_factory.mktemp("dra-agent")),
        [real_node.name],
        extra=[
            "--dra=true",
            "--driver=sim",
            "--sim-chips=910B3=1",
            f"--sim-device-dir={dev}",
            f"--cdi-host-device-dir={dev}",
            f"--cdi-dir={real_node.cdi_dir}",
        ],
    )
    agent.start()
    wait_for("VNPUNode published", lambda: plane.get_json("vnpunode", real_node.name), 30)
    wait_for("the plugin's registration socket", REGISTRATION.exists, 10)
    wait_for(
        "the kubelet registered the plugin",
        lambda: "the kubelet registered DRA plugin" in agent.log_tail(400),
        30,
    )
    try:
        yield agent
    finally:
        try:
            release_node_allocations(plane, real_node)
        finally:
            agent.kill(signal.SIGTERM)
            plane.kubectl("delete", "vnpunode", real_node.name, "--wait=false", check=False)
            plane.kubectl(
                "delete", "resourceslices.resource.k8s.io",
                f"--field-selector=spec.nodeName={real_node.name}", check=False,
            )  # fmt: skip
            plane.kubectl(
                "delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(real_node.name),
                check=False,
            )  # fmt: skip


def _pod(node: RealNode, namespace: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"dra-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 2,
            "resourceClaims": [{"name": "npu", "resourceClaimName": claim}],
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


def _json(plane: LocalPlane, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(plane.kubectl(*args, "-o", "json").stdout)
    return out


def test_the_kubelet_prepares_a_claim_and_containerd_injects_the_vnpu(
    plane: LocalPlane, real_node: RealNode, dra_agent: AgentProcess, namespace: str
) -> None:
    kubectl = plane.kubectl
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(resource_claim(namespace, "npu")))
    claim = _json(plane, "get", "resourceclaims.resource.k8s.io", "npu", "-n", namespace)
    uid = claim["metadata"]["uid"]

    # The operator's VNPUAllocation for the device; the agent makes the vNPU.
    alloc_name = names.dra_allocation_name(uid, DEVICE)
    alloc = allocation(alloc_name, node=real_node.name, vnpu_id=VNPU_ID, template=TEMPLATE)
    alloc["metadata"]["labels"][names.LABEL_CLAIM_UID] = uid
    alloc["spec"]["claim"] = {"name": "npu", "uid": uid, "request": "npu", "device": DEVICE}
    create(plane, namespace, alloc)
    wait_for(
        "allocation Ready",
        lambda: phase(plane, namespace, alloc_name) == names.PHASE_READY,
        30,
    )

    # The pod, and the claim allocated and reserved for it as the scheduler would.
    pod = _pod(real_node, namespace, "npu")
    kubectl("create", "-f", "-", input=json.dumps(pod))
    name = pod["metadata"]["name"]
    pod_uid = _json(plane, "get", "pod", name, "-n", namespace)["metadata"]["uid"]
    result = {"request": "npu", "driver": names.DRA_DRIVER, "pool": real_node.name,
              "device": DEVICE}  # fmt: skip
    status = {
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod_uid}],
        }
    }
    kubectl("patch", "resourceclaims.resource.k8s.io", "npu", "-n", namespace,
            "--subresource=status", "--type=merge", "-p", json.dumps(status))  # fmt: skip

    running(plane, namespace, name, timeout=90)
    spec = cdi.claim_spec_path(real_node.cdi_dir, uid, DEVICE)
    assert spec.exists(), "the plugin wrote no CDI spec"
    listing = exec_in(plane, namespace, name, "ls", "/dev").split()
    assert f"davinci{VNPU_ID}" in listing
    assert {"davinci_manager", "devmm_svm", "hisi_hdc"} <= set(listing)
    env = exec_in(plane, namespace, name, "sh", "-c", f"echo ${names.ENV_VISIBLE_DEVICES}")
    assert env.strip() == str(VNPU_ID)
    seen = exec_in(plane, namespace, name, "stat", "-c", "%t:%T", f"/dev/davinci{VNPU_ID}")
    host = os.stat(real_node.device_dir / f"vdavinci{VNPU_ID}")
    assert seen.strip() == f"{os.major(host.st_rdev):x}:{os.minor(host.st_rdev):x}"

    # The allocation goes while the pod runs: its vNPU stays (the claim is prepared).
    kubectl("delete", "vnpuallocation", alloc_name, "-n", namespace, "--wait=false")
    wait_for(
        "destroy deferred",
        lambda: phase(plane, namespace, alloc_name) == names.PHASE_RELEASING,
        30,
    )
    deferred = get_alloc(plane, namespace, alloc_name)
    assert deferred is not None
    assert "still prepared" in deferred["status"]["message"]
    assert (real_node.device_dir / f"vdavinci{VNPU_ID}").exists()

    # The pod ends: the kubelet unprepares the claim, the vNPU and the allocation go.
    kubectl("delete", "pod", name, "-n", namespace, "--wait=true", timeout=60)
    wait_for("claim unprepared", lambda: not spec.exists(), 60)
    wait_for("allocation gone", lambda: get_alloc(plane, namespace, alloc_name) is None, 60)
    assert not (real_node.device_dir / f"vdavinci{VNPU_ID}").exists()


def _templated_pod(node: RealNode, namespace: str, name: str, template: str) -> dict[str, Any]:
    """A pod the scheduler places: a claim from a template, no nodeName."""
    pod = _pod(node, namespace, "unused")
    pod["metadata"]["name"] = name
    del pod["spec"]["nodeName"]
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    pod["spec"]["resourceClaims"] = [{"name": "npu", "resourceClaimTemplateName": template}]
    return pod


def test_scheduler_operator_agent_and_kubelet_together_give_each_pod_its_own_vnpu(
    plane: LocalPlane,
    real_node: RealNode,
    dra_agent: AgentProcess,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The whole DRA path with nothing written by hand: the scheduler allocates a
    device of the node's pool, the operator declares it, the agent creates the
    vNPU, the binding condition lets the pod bind, the kubelet prepares the
    claim through the plugin and containerd injects the device. Two pods each
    see their own vNPU and not the other's; a plain pod sees none."""
    plane.apply(device_class())
    plane.apply(claim_template(namespace, "small", TEMPLATE))
    operator = OperatorProcess(plane, tmp_path / "operator")
    operator.start()
    try:
        names_ = ("claimed-a", "claimed-b")
        for name in names_:
            plane.apply(_templated_pod(real_node, namespace, name, "small"))
        seen: dict[str, set[str]] = {}
        for name in names_:
            running(plane, namespace, name, timeout=120)
            listing = exec_in(plane, namespace, name, "ls", "/dev").split()
            seen[name] = {d for d in listing if d.startswith("davinci") and d[7:].isdigit()}
        allocs = [
            a
            for a in (plane.get_json("vnpuallocations", "-n", namespace) or {}).get("items", [])
            if a["spec"].get("claim")
        ]
        ids = sorted(a["spec"]["vnpuId"] for a in allocs)
        assert len(ids) == 2
        assert len(set(ids)) == 2
        # Each container sees exactly one vNPU, its own, and the two differ.
        assert all(len(s) == 1 for s in seen.values()), seen
        assert seen["claimed-a"] != seen["claimed-b"], seen
        assert {d for s in seen.values() for d in s} == {f"davinci{i}" for i in ids}
        plain = _pod(real_node, namespace, "unused")
        plain["metadata"]["name"] = "plain"
        del plain["spec"]["resourceClaims"]
        del plain["spec"]["containers"][0]["resources"]
        plane.kubectl("create", "-f", "-", input=json.dumps(plain))
        running(plane, namespace, "plain", timeout=90)
        listing = exec_in(plane, namespace, "plain", "ls", "/dev").split()
        assert not [d for d in listing if d.startswith("davinci")], listing

        for name in (*names_, "plain"):
            plane.kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
        wait_for(
            "claims' allocations released",
            lambda: (
                not [
                    a
                    for a in (plane.get_json("vnpuallocations", "-n", namespace) or {}).get(
                        "items", []
                    )
                    if a["spec"].get("claim")
                ]
            ),
            90,
        )
        for i in ids:
            assert not (real_node.device_dir / f"vdavinci{i}").exists()
    finally:
        operator.kill(signal.SIGTERM)
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)


# -- what the kubelet does to the plugin (issue 54, item 9) -------------------


def _davinci(plane: LocalPlane, namespace: str, pod: str) -> set[str]:
    listing = exec_in(plane, namespace, pod, "ls", "/dev").split()
    return {d for d in listing if d.startswith("davinci") and d[7:].isdigit()}


def _execs(plane: LocalPlane, namespace: str, pod: str) -> bool:
    try:
        exec_in(plane, namespace, pod, "true")
    except PlaneError:
        return False
    return True


def _claim_allocs(plane: LocalPlane, namespace: str) -> list[dict[str, Any]]:
    items = (plane.get_json("vnpuallocations", "-n", namespace) or {}).get("items", [])
    return [a for a in items if a["spec"].get("claim")]


def _pool(plane: LocalPlane, node: str) -> list[str]:
    got = plane.get_json(
        "resourceslices.resource.k8s.io", f"--field-selector=spec.nodeName={node}"
    ) or {"items": []}
    return sorted(s["metadata"]["name"] for s in got.get("items", []))


@pytest.fixture
def operator(plane: LocalPlane, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    plane.apply(device_class())
    plane.apply(claim_template(namespace, "small", TEMPLATE))
    proc = OperatorProcess(plane, tmp_path / "operator")
    proc.start()
    try:
        yield proc
    finally:
        for pod in (plane.get_json("pods", "-n", namespace) or {}).get("items", []):
            plane.kubectl("delete", "pod", pod["metadata"]["name"], "-n", namespace,
                          "--wait=false", check=False)  # fmt: skip
        wait_for("the claims' allocations released", lambda: not _claim_allocs(plane, namespace),
                 90)  # fmt: skip
        proc.kill(signal.SIGTERM)
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)


def _registrations(agent: AgentProcess) -> int:
    return agent.log_path.read_text(errors="replace").count("the kubelet registered DRA plugin")


def _restart_agent(agent: AgentProcess, env: dict[str, str] | None = None) -> None:
    seen = _registrations(agent)
    agent.kill(signal.SIGTERM)
    agent.start(env=env)
    wait_for("the kubelet registered the plugin again", lambda: _registrations(agent) > seen, 30)


def test_a_kubelet_restart_keeps_running_claims_and_the_pool_is_back_in_seconds(
    plane: LocalPlane,
    real_node: RealNode,
    dra_agent: AgentProcess,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    """The kubelet wipes the node's slices at its start and prepares its pods'
    claims again: the running pod keeps exactly its vNPU, the pool is back
    within seconds (not the agent's 300 s read-back), and the next pod gets a
    vNPU of its own."""
    plane.apply(_templated_pod(real_node, namespace, "kept", "small"))
    running(plane, namespace, "kept", timeout=120)
    before = _davinci(plane, namespace, "kept")
    pool = _pool(plane, real_node.name)
    assert pool
    assert len(before) == 1

    seen = _registrations(dra_agent)
    real_node.restart_kubelet()
    # The new kubelet wipes the node's slices, then registers the plugin again.
    wait_for("the plugin registered again", lambda: _registrations(dra_agent) > seen, 60)
    wait_for("the pool back", lambda: _pool(plane, real_node.name) == pool, 20, interval=0.5)
    # The pod's status is the old kubelet's until the new one has synced it.
    wait_for("the kubelet serves the pod again", lambda: _execs(plane, namespace, "kept"), 60)
    assert _davinci(plane, namespace, "kept") == before

    plane.apply(_templated_pod(real_node, namespace, "after", "small"))
    running(plane, namespace, "after", timeout=120)
    after = _davinci(plane, namespace, "after")
    assert len(after) == 1
    assert not after & before, (before, after)


def test_a_force_deleted_pods_vnpu_is_never_the_next_pods(
    plane: LocalPlane,
    real_node: RealNode,
    dra_agent: AgentProcess,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    """k/k#141471: a pod deleted with grace 0 leaves its containers running
    while its claim is deallocated and the device offered again. The next pod
    on the same device never gets the first pod's vNPU, which is destroyed
    only once the kubelet has unprepared the first claim."""
    first = _templated_pod(real_node, namespace, "first", "small")
    # Ignores SIGTERM: its container outlives the force delete by a grace period.
    first["spec"]["containers"][0]["command"] = [
        "sh",
        "-c",
        "trap '' TERM; while :; do sleep 1; done",
    ]
    first["spec"]["terminationGracePeriodSeconds"] = 10
    plane.apply(first)
    running(plane, namespace, "first", timeout=120)
    (held,) = _davinci(plane, namespace, "first")
    held_id = int(held[len("davinci") :])

    plane.kubectl("delete", "pod", "first", "-n", namespace, "--grace-period=0", "--force")
    plane.apply(_templated_pod(real_node, namespace, "second", "small"))
    running(plane, namespace, "second", timeout=120)
    assert held not in _davinci(plane, namespace, "second")
    wait_for(
        "the first pod's vNPU destroyed once its claim is unprepared",
        lambda: not (real_node.device_dir / f"vdavinci{held_id}").exists(),
        90,
    )
    assert len(_claim_allocs(plane, namespace)) == 1  # the second pod's alone


def test_a_release_during_a_prepare_waits_for_it_on_the_real_node(
    plane: LocalPlane,
    real_node: RealNode,
    dra_agent: AgentProcess,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    """Item 1: the pod (and so its claim) goes while the kubelet's Prepare is
    between its reads and its save (a failpoint widens the window). The vNPU
    is not destroyed under the Prepare: the allocation waits `Releasing`
    (being prepared), and goes once the kubelet has unprepared the claim."""
    _restart_agent(dra_agent, env={"VNPU_FAILPOINTS": "dra-prepare-after-reads=20"})
    try:
        plane.apply(_templated_pod(real_node, namespace, "raced", "small"))
        wait_for(
            "the Prepare held after its reads",
            lambda: "failpoint dra-prepare-after-reads" in dra_agent.log_tail(200),
            120,
        )
        (alloc,) = _claim_allocs(plane, namespace)
        name, vnpu_id = alloc["metadata"]["name"], alloc["spec"]["vnpuId"]
        plane.kubectl("delete", "pod", "raced", "-n", namespace, "--grace-period=0", "--force")

        def deferred() -> bool:
            got = get_alloc(plane, namespace, name)
            status = (got or {}).get("status") or {}
            return status.get("phase") == names.PHASE_RELEASING

        wait_for("the release deferred", deferred, 30)
        got = get_alloc(plane, namespace, name)
        assert got is not None
        assert "being prepared" in got["status"]["message"]
        assert (real_node.device_dir / f"vdavinci{vnpu_id}").exists()
        wait_for("the allocation released", lambda: get_alloc(plane, namespace, name) is None, 90)
        assert not (real_node.device_dir / f"vdavinci{vnpu_id}").exists()
    finally:
        _restart_agent(dra_agent)


# -- what the container sees (issue 55, item 5) --------------------------------


def _exec(plane: LocalPlane, namespace: str, pod: str, container: str, *cmd: str) -> str:
    return plane.kubectl("exec", "-n", namespace, pod, "-c", container, "--", *cmd).stdout


def test_a_container_knows_its_non_first_vnpus_by_cann_index_and_by_metadata(
    plane: LocalPlane, real_node: RealNode, dra_agent: AgentProcess, namespace: str
) -> None:
    """One claim, two requests, one container each, under the Ascend runtime
    stand-in (which adds again what CDI injected, as the real one does). Each
    container sees its request's vNPUs, none of them the chip's first, as
    CANN's devices 0..n-1 (ASCEND_RT_VISIBLE_DEVICES) whatever the image
    said, the ids in ASCEND_VISIBLE_DEVICES, and its request's KEP-5304
    metadata file at the path k8s.io/dynamic-resource-allocation v0.37 mounts
    it; the other request's file is not there. Unprepare removes the files."""
    ids = {names.dra_device_name(0, TEMPLATE, 3): 110, names.dra_device_name(0, TEMPLATE, 1): 103,
           names.dra_device_name(0, TEMPLATE, 2): 107}  # fmt: skip
    requests = {"pair": list(ids)[:2], "one": list(ids)[2:]}
    claim = resource_claim(namespace, "split")
    claim["spec"]["devices"]["requests"] = [
        {"name": "pair", "exactly": {"deviceClassName": names.DRA_DEVICE_CLASS, "count": 2}},
        {"name": "one", "exactly": {"deviceClassName": names.DRA_DEVICE_CLASS}},
    ]
    plane.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(claim))
    uid = _json(plane, "get", "resourceclaims.resource.k8s.io", "split", "-n", namespace)[
        "metadata"
    ]["uid"]
    for request, devices in requests.items():
        for device in devices:
            name = names.dra_allocation_name(uid, device)
            alloc = allocation(name, node=real_node.name, vnpu_id=ids[device], template=TEMPLATE)
            alloc["metadata"]["labels"][names.LABEL_CLAIM_UID] = uid
            alloc["spec"]["claim"] = {"name": "split", "uid": uid, "request": request,
                                      "device": device}  # fmt: skip
            create(plane, namespace, alloc)
    for device in ids:
        name = names.dra_allocation_name(uid, device)
        wait_for(
            f"{name} Ready", lambda n=name: phase(plane, namespace, n) == names.PHASE_READY, 30
        )

    pod = _pod(real_node, namespace, "split")
    pod["spec"]["runtimeClassName"] = ASCEND_HANDLER
    (main,) = pod["spec"]["containers"]
    # What an image built on a bare-metal host may carry: an id, not an index.
    main["env"] = [{"name": names.ENV_RT_VISIBLE_DEVICES, "value": "110"}]
    pod["spec"]["containers"] = [
        {**main, "name": request, "resources": {"claims": [{"name": "npu", "request": request}]}}
        for request in requests
    ]
    kubectl = plane.kubectl
    kubectl("create", "-f", "-", input=json.dumps(pod))
    pod_name = pod["metadata"]["name"]
    pod_uid = _json(plane, "get", "pod", pod_name, "-n", namespace)["metadata"]["uid"]
    results = [
        {"request": r, "driver": names.DRA_DRIVER, "pool": real_node.name, "device": d}
        for r, devices in requests.items()
        for d in devices
    ]
    status = {
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}],
        }
    }
    kubectl("patch", "resourceclaims.resource.k8s.io", "split", "-n", namespace,
            "--subresource=status", "--type=merge", "-p", json.dumps(status))  # fmt: skip
    running(plane, namespace, pod_name, timeout=90)

    root = names.DRA_METADATA_CONTAINER_DIR
    for request, want_ids, indexes in [("pair", [103, 110], "0,1"), ("one", [107], "0")]:
        listing = _exec(plane, namespace, pod_name, request, "ls", "/dev").split()
        assert sorted(d for d in listing if d.startswith("davinci") and d[7:].isdigit()) == sorted(
            f"davinci{i}" for i in want_ids
        ), listing
        env = dict(
            line.split("=", 1)
            for line in _exec(plane, namespace, pod_name, request, "env").splitlines()
            if "=" in line
        )
        assert env[names.ENV_VISIBLE_DEVICES] == ",".join(str(i) for i in want_ids)
        assert env[names.ENV_RT_VISIBLE_DEVICES] == indexes
        assert env[names.ENV_RUNTIME_OPTIONS] == names.RUNTIME_OPTIONS_VIRTUAL
        assert env[names.ENV_VNPU_SPECS] == ""

        mine = f"{root}/resourceclaims/split/{request}/{names.DRA_METADATA_FILE}"
        text = _exec(plane, namespace, pod_name, request, "cat", mine)
        newest, older = metadata.read_objects(text)
        assert [newest["apiVersion"], older["apiVersion"]] == list(names.DRA_METADATA_API_VERSIONS)
        assert newest["metadata"]["uid"] == uid
        (got,) = newest["requests"]
        assert got["name"] == request
        assert [(d["pool"], d["attributes"]["vnpuId"]["int"], d["attributes"]["chip"]["int"],
                 d["attributes"]["template"]["string"]) for d in got["devices"]] == [
            (real_node.name, i, 0, TEMPLATE) for i in want_ids
        ]  # fmt: skip
        other = "one" if request == "pair" else "pair"
        absent = f"{root}/resourceclaims/split/{other}/{names.DRA_METADATA_FILE}"
        probe = f"test -e {absent} && echo there || echo absent"
        assert _exec(plane, namespace, pod_name, request, "sh", "-c", probe).strip() == "absent"
        # Read-only in the container.
        wrote = _exec(plane, namespace, pod_name, request, "sh", "-c",
                      f"echo x >> {mine} 2>/dev/null && echo wrote || echo refused")  # fmt: skip
        assert wrote.strip() == "refused"

    # Wherever the agent keeps them on the host: the specs' mounts say.
    hosts = set()
    for device in ids:
        spec = json.loads(cdi.claim_spec_path(real_node.cdi_dir, uid, device).read_text())
        (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
        hosts.add(Path(mount["hostPath"]))
    assert sorted(h.parent.name for h in hosts) == ["one", "pair"]
    assert all(h.exists() for h in hosts)
    kubectl("delete", "pod", pod_name, "-n", namespace, "--wait=true", timeout=60)
    wait_for("the claim's metadata removed", lambda: not [h for h in hosts if h.exists()], 60)
    for device in ids:
        kubectl("delete", "vnpuallocation", names.dra_allocation_name(uid, device), "-n",
                namespace, "--wait=true", timeout=60)  # fmt: skip
