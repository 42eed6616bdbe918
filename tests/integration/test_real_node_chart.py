"""Stage E of the real node: the product's own image (built from Dockerfile by
hack/image/build.sh), installed by its Helm chart, running on the real kubelet.

The chart's operator Deployment and agent DaemonSet (sim driver, device nodes in
the node's device dir for the Ascend runtime stand-in) run on the real node only;
a kwok NPU node next to it gets no agent pod. Their pods reach the API server at
the CNI bridge's gateway (`apiServer.host`): there is no kube-proxy. Then vNPU pods
run with exactly their devices, the agent pod and the operator pod are deleted
mid-life (nothing lost, leaked or booked twice), `helm upgrade` rolls both
operator replicas during a churn of vNPU pods (none refused, none stuck), and
the documented uninstall order leaves no pod stuck and no vNPU.

The tests share one release and one namespace of vNPU pods and run in file order:
install first, uninstall last. Needs root (the real node, the image build).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, RELEASE, helm
from realnode_harness import (
    allocation_ids,
    check_devices,
    exec_in,
    ready_for_release,
    running,
    vnpu_busybox_pod,
)

from localplane import productimage
from localplane.chart import real_node_values
from localplane.components import vnpu_ids
from localplane.nodes import NodeSpec, parse_chips
from localplane.plane import LocalPlane
from localplane.realnode import ASCEND_HANDLER, RealNode
from localplane.waiting import wait_for
from vnpu_agent.drivers.sim import SimDriver
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.realnode]

NAMESPACE = "vnpu-realnode"  # the release's
WORK = "vnpu-realnode-work"  # the vNPU pods', kept across the tests of the module
RUNTIME_CLASS = "vnpu-ascend"  # created by the chart, handler `ascend`
KWOK_NPU_NODE = "realnode-chart-kwok-npu"
CHIPS = "910B3=2"  # eight vir05_1c_16g vNPUs: the module uses six
VNPUS_PER_CHIP = 4  # vir05_1c_16g on a 910B3
COMPONENT = "app.kubernetes.io/component"
# CAP_MKNOD (bit 27) alone, as /proc/<pid>/status shows CapEff.
CAP_MKNOD_ONLY = f"{1 << 27:016x}"


@dataclass
class Release:
    node: RealNode
    image: productimage.ProductImage
    state_dir: Path
    timings: dict[str, float] = field(default_factory=dict)
    installed: bool = True

    @property
    def sim(self) -> SimDriver:
        """The agent pod's simulated driver, read through its hostPath state."""
        return SimDriver(self.state_dir / self.node.name / "sim" / "state.json")


def component_pods(plane: LocalPlane, component: str) -> list[dict[str, Any]]:
    pods = plane.get_json("pods", "-n", NAMESPACE, "-l", f"{COMPONENT}={component}")
    return list(pods["items"])


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def ready_pod(
    plane: LocalPlane, component: str, *, not_named: str = "", timeout: float = 180
) -> dict[str, Any]:
    """The chart's pod of `component` once it is Ready (another than `not_named`)."""

    def find() -> dict[str, Any] | None:
        for pod in component_pods(plane, component):
            if pod["metadata"]["name"] != not_named and _ready(pod):
                return pod
        return None

    try:
        found: dict[str, Any] = wait_for(f"{component} pod Ready", find, timeout, interval=0.5)
    except AssertionError:
        pods = component_pods(plane, component)
        logs = {}
        for pod in pods:
            name = pod["metadata"]["name"]
            logs[name] = plane.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout[-3000:]
        raise AssertionError(
            f"no Ready {component} pod: {[p.get('status') for p in pods]}\nlogs: {logs}"
        ) from None
    return found


def node_allocations(plane: LocalPlane, node: str) -> dict[str, tuple[int, str]]:
    """namespace/name -> (vNPU id, phase) of every allocation on `node`."""
    items = plane.get_json("vnpuallocations", "-A", "-l", f"{names.LABEL_NODE}={node}")["items"]
    return {
        f"{a['metadata']['namespace']}/{a['metadata']['name']}": (
            a["spec"]["vnpuId"],
            (a.get("status") or {}).get("phase", ""),
        )
        for a in items
    }


def host_devices(node: RealNode) -> set[int]:
    """The vNPU ids whose device nodes exist on the host (made by the agent pod)."""
    return {int(p.name.removeprefix("vdavinci")) for p in node.device_dir.glob("vdavinci*")}


def assert_books_agree(plane: LocalPlane, release: Release) -> dict[str, tuple[int, str]]:
    """Allocations, the driver and the host's device nodes name the same vNPUs,
    each once, all Ready. Returns the allocations."""
    allocs = node_allocations(plane, release.node.name)
    ids = [vnpu_id for vnpu_id, _ in allocs.values()]
    assert len(ids) == len(set(ids)), f"a vNPU booked twice: {allocs}"
    assert all(phase == names.PHASE_READY for _, phase in allocs.values()), allocs
    assert set(vnpu_ids(release.sim)) == set(ids), (vnpu_ids(release.sim), allocs)
    assert host_devices(release.node) == set(ids)
    return allocs


def no_traceback(plane: LocalPlane, pod: str) -> None:
    logs = plane.kubectl("logs", "-n", NAMESPACE, pod, check=False).stdout
    assert "Traceback" not in logs, logs[-4000:]


def _uninstall(plane: LocalPlane, release: Release) -> None:
    """The documented order: vNPU pods, then their allocations gone, then helm."""
    plane.kubectl("delete", "pods", "--all", "-n", WORK, "--wait=false", check=False)
    wait_for(
        "allocations on the real node gone",
        lambda: not node_allocations(plane, release.node.name),
        120,
        interval=0.5,
    )
    helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s")
    release.installed = False


@pytest.fixture(scope="module")
def release(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    workdir = Path(tmp_path_factory.mktemp("realnode-chart"))
    t0 = time.monotonic()
    image = productimage.build(progress=lambda line: print(line))
    build_s = time.monotonic() - t0
    t0 = time.monotonic()
    real_node.import_image(image.archive)
    release = Release(real_node, image, workdir / "agent-state")
    release.timings.update(image_build=build_s, image_import=time.monotonic() - t0)

    # The node's device dir outlives a module's agent: an earlier one's leftovers go,
    # as do a local operator's webhooks (the release brings its own).
    ready_for_release(plane, real_node, NAMESPACE, WORK)
    real_node.add_davinci_manager()
    # An NPU node kwok serves: the DaemonSet must leave it alone (its agent would never run).
    plane.add_nodes([NodeSpec(name=KWOK_NPU_NODE, chips={"910B3": 2})])
    values = real_node_values(
        plane, real_node, image, runtime_class=RUNTIME_CLASS, chips=CHIPS,
        state_dir=release.state_dir, cdi_dir=workdir / "cdi",
    )  # fmt: skip
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    try:
        t0 = time.monotonic()
        helm(plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file))
        ready_pod(plane, "operator")
        ready_pod(plane, "agent")
        all_operator_replicas_ready(plane)
        release.timings["helm_install_to_ready"] = time.monotonic() - t0
        print(f"[realnode-chart] image {image.ref}, timings {release.timings}")
        yield release
    finally:
        try:
            if release.installed:
                _uninstall(plane, release)
        finally:
            print(f"[realnode-chart] timings: {release.timings}")
            plane.install_policies()
            plane.kubectl("label", "node", real_node.name, f"{names.LABEL_NPU_NODE}-",
                          check=False)  # fmt: skip
            plane.kubectl("delete", "node", KWOK_NPU_NODE, "--wait=false", check=False)
            for ns in (WORK, NAMESPACE):
                plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def start_vnpu_pod(plane: LocalPlane, release: Release, name: str, count: int) -> dict[str, Any]:
    """A vNPU pod in WORK, once Running; records its create -> Running time."""
    t0 = time.monotonic()
    plane.apply(vnpu_busybox_pod(name, WORK, count))
    try:
        pod = running(plane, WORK, name, timeout=120)
    except AssertionError as exc:
        status = (plane.get_json("pod", name, "-n", WORK) or {}).get("status")
        events = plane.kubectl("get", "events", "-n", WORK, "--field-selector",
                               f"involvedObject.name={name}", check=False).stdout  # fmt: skip
        raise AssertionError(f"{exc}\nstatus: {status}\nevents:\n{events}") from None
    took = time.monotonic() - t0
    release.timings[f"vnpu_pod_{name}_to_running"] = took
    print(f"[realnode-chart] vNPU pod {name} create -> Running: {took:.2f}s")
    return pod


def all_operator_replicas_ready(plane: LocalPlane, timeout: float = 180) -> None:
    """Wait until every replica of the operator Deployment is Ready: a standby
    syncs its caches before its readiness probe passes, so it may trail the leader."""

    def ready() -> bool:
        deploy = plane.get_json("deployment", f"{RELEASE}-operator", "-n", NAMESPACE)
        status = deploy.get("status", {})
        return bool(status.get("readyReplicas", 0) == deploy["spec"]["replicas"])

    try:
        wait_for("every operator replica Ready", ready, timeout, interval=0.5)
    except AssertionError:
        pods = component_pods(plane, "operator")
        raise AssertionError(
            f"not every operator replica Ready: {[p.get('status') for p in pods]}"
        ) from None


def test_chart_pods_run_the_product_image_on_the_real_node_only(
    plane: LocalPlane, release: Release
) -> None:
    node = release.node.name
    ds = plane.get_json("daemonset", f"{RELEASE}-agent", "-n", NAMESPACE)
    # The kwok NPU node matches vnpu.io/npu=true but not the real-node label.
    assert ds["status"]["desiredNumberScheduled"] == 1
    assert ds["status"]["numberReady"] == 1
    assert plane.get_json("node", KWOK_NPU_NODE)["metadata"]["labels"][names.LABEL_NPU_NODE]
    deploy = plane.get_json("deployment", f"{RELEASE}-operator", "-n", NAMESPACE)
    # The chart's default is two replicas, both on this one node (the spread is
    # soft); the fixture waited for both to be Ready.
    assert deploy["spec"]["replicas"] == 2
    assert deploy["status"]["readyReplicas"] == 2

    expected = {"operator": ("10001", "0" * 16), "agent": ("0", CAP_MKNOD_ONLY)}
    for component, (uid, caps) in expected.items():
        pod = ready_pod(plane, component)
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == node, component
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"] == release.image.ref, component
        assert status["restartCount"] == 0, component
        assert exec_in(plane, NAMESPACE, name, "id", "-u").strip() == uid, component
        proc = exec_in(plane, NAMESPACE, name, "cat", "/proc/1/status")
        cap_eff = next(line.split()[1] for line in proc.splitlines() if line.startswith("CapEff"))
        assert cap_eff == caps, component
        no_traceback(plane, name)
        # A read-only root filesystem, as the chart says.
        out = plane.kubectl("exec", "-n", NAMESPACE, name, "--", "touch", "/opt/probe",
                            check=False)  # fmt: skip
        assert out.returncode != 0, component
        assert "Read-only file system" in out.stderr, component

    # The agent pod wrote its state (hostPath) and published the node's chips.
    assert (release.state_dir / node / "sim" / "state.json").is_file()
    vnpunode = wait_for("VNPUNode of the real node", lambda: plane.get_json("vnpunode", node), 30)
    models = [m for m, n in parse_chips(CHIPS).items() for _ in range(n)]
    assert [c["model"] for c in vnpunode["status"]["chips"]] == models
    assert plane.get_json("runtimeclass", RUNTIME_CLASS)["handler"] == ASCEND_HANDLER


def test_helm_test_passes_in_the_product_image_on_the_real_node(
    plane: LocalPlane, release: Release
) -> None:
    """`helm test` for real: the hook pod runs files/check_webhook.py in the product
    image on the real kubelet (uid 10001, read-only root, reaching the API server
    the way the chart's components do) and passes only on the webhook's refusal.
    Helm's `--logs` comes after the passed pod's cleanup, so the verdict is its phase."""
    t0 = time.monotonic()
    out = helm(plane, "test", RELEASE, "-n", NAMESPACE, "--timeout=180s", check=False)
    release.timings["helm_test"] = time.monotonic() - t0
    report = f"{out.stdout}\n{out.stderr}"
    # The script exits 0 only on the vnpu-operator webhook's refusal of its template.
    assert out.returncode == 0, report
    suite = out.stdout.split(f"TEST SUITE:     {RELEASE}-test-webhook", 1)
    assert len(suite) == 2, report
    assert re.search(r"Phase:\s+Succeeded", suite[1]), report
    # hook-succeeded: the hook's pod is gone once it passed.
    leftover = [
        p["metadata"]["name"]
        for p in plane.get_json("pods", "-n", NAMESPACE)["items"]
        if p["metadata"]["name"].startswith(f"{RELEASE}-test")
    ]
    assert not leftover, leftover


def test_vnpu_pods_see_exactly_their_devices(plane: LocalPlane, release: Release) -> None:
    pod = start_vnpu_pod(plane, release, "two", 2)
    assert pod["spec"]["runtimeClassName"] == RUNTIME_CLASS
    assert pod["spec"]["nodeName"] == release.node.name
    ids = check_devices(plane, WORK, pod)
    assert len(ids) == 2
    # The agent pod made their device nodes on the host (CAP_MKNOD), the driver holds them.
    assert host_devices(release.node) == set(ids)
    assert set(vnpu_ids(release.sim)) == set(ids)

    other = check_devices(plane, WORK, start_vnpu_pod(plane, release, "one", 1))
    assert len(other) == 1
    assert not set(other) & set(ids)
    assert_books_agree(plane, release)


def _pods_keep_their_devices(plane: LocalPlane, before: dict[str, list[int]]) -> None:
    for name, ids in before.items():
        pod = plane.get_json("pod", name, "-n", WORK)
        assert pod["status"]["phase"] == "Running", name
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, name
        assert check_devices(plane, WORK, pod) == ids, name


def _replace_pod(plane: LocalPlane, release: Release, component: str) -> dict[str, Any]:
    """Deletes the chart's pod of `component`; returns its Ready successor."""
    old = ready_pod(plane, component)["metadata"]["name"]
    t0 = time.monotonic()
    plane.kubectl("delete", "pod", "-n", NAMESPACE, old, "--wait=true", timeout=120)
    release.timings[f"{component}_pod_delete"] = time.monotonic() - t0
    new = ready_pod(plane, component, not_named=old)
    release.timings[f"{component}_pod_replaced_ready"] = time.monotonic() - t0
    print(f"[realnode-chart] {component} pod {old} deleted and replaced: {release.timings}")
    no_traceback(plane, new["metadata"]["name"])
    return new


def _live(plane: LocalPlane) -> dict[str, list[int]]:
    pods = plane.get_json("pods", "-n", WORK)["items"]
    return {p["metadata"]["name"]: allocation_ids(plane, WORK, p) for p in pods}


def test_agent_pod_deleted_mid_life_loses_and_leaks_nothing(
    plane: LocalPlane, release: Release
) -> None:
    start_vnpu_pod(plane, release, "before-agent", 1)
    before = _live(plane)
    books = assert_books_agree(plane, release)
    lease = names.lease_name(release.node.name)
    renewed = plane.get_json("lease", lease, "-n", NAMESPACE)["spec"]["renewTime"]

    _replace_pod(plane, release, "agent")

    # The new agent took over the same vNPUs: same allocations, all Ready, the driver
    # and the host unchanged, the pods never restarted.
    assert assert_books_agree(plane, release) == books
    _pods_keep_their_devices(plane, before)
    wait_for(
        "the new agent renews the Lease",
        lambda: plane.get_json("lease", lease, "-n", NAMESPACE)["spec"]["renewTime"] != renewed,
        60,
        interval=1,
    )
    used = {i for ids in before.values() for i in ids}
    (after,) = check_devices(plane, WORK, start_vnpu_pod(plane, release, "after-agent", 1))
    assert after not in used
    assert_books_agree(plane, release)


def test_operator_pod_deleted_mid_life_loses_and_leaks_nothing(
    plane: LocalPlane, release: Release
) -> None:
    before = _live(plane)
    assert before, "the earlier tests' vNPU pods are gone"
    books = assert_books_agree(plane, release)

    _replace_pod(plane, release, "operator")

    assert assert_books_agree(plane, release) == books
    _pods_keep_their_devices(plane, before)
    # The new operator's ledger knows every vNPU in use: a new pod gets a free one.
    used = {i for ids in before.values() for i in ids}
    (after,) = check_devices(plane, WORK, start_vnpu_pod(plane, release, "after-operator", 1))
    assert after not in used
    books = assert_books_agree(plane, release)
    assert len(books) == len(used) + 1


def test_the_kubelet_admits_charged_pods_and_quota_caps_the_namespace(
    plane: LocalPlane, release: Release
) -> None:
    """The real kubelet admits a pod only if the node's allocatable covers its
    requests: the operator advertises the chips' totals, and vNPU pods carry their
    charge, so a quota on WORK counts them."""
    node = plane.get_json("node", release.node.name)
    allocatable = node["status"]["allocatable"]
    chips = plane.get_json(names.NODE_PLURAL, release.node.name)["status"]["chips"]
    assert int(allocatable[names.RES_AICORE]) == sum(c["aicoreTotal"] for c in chips), allocatable
    held = sum(len(ids) for ids in _live(plane).values())
    counted = f"{names.QUOTA_PREFIX}{names.RES_VNPUS}"
    hard = {counted: str(held + 1)}
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "vnpu", "namespace": WORK}, "spec": {"hard": hard}}  # fmt: skip
    plane.apply(quota)
    try:
        wait_for(
            "quota counted",
            lambda: plane.quota_used(WORK, "vnpu").get(counted) == str(held),
            timeout=30,
        )
        pod = start_vnpu_pod(plane, release, "charged", 1)
        (main,) = pod["spec"]["containers"]
        assert main["resources"]["limits"][names.RES_VNPUS] == "1"
        check_devices(plane, WORK, pod)
        wait_for(
            "quota full",
            lambda: plane.quota_used(WORK, "vnpu").get(counted) == str(held + 1),
            timeout=30,
        )
        refused = plane.kubectl("create", "-f", "-", check=False,
                                input=json.dumps(vnpu_busybox_pod("over", WORK, 1)))  # fmt: skip
        assert refused.returncode != 0
        assert f"namespace {WORK} is over its vNPU quota" in refused.stderr, refused.stderr
    finally:
        plane.kubectl("delete", "resourcequota", "vnpu", "-n", WORK, check=False)


def test_a_cordoned_chip_of_the_real_node_gets_nothing_new(
    plane: LocalPlane, release: Release
) -> None:
    """Every chip with room left is cordoned: a new pod waits, told so, while the
    running pods keep their devices; uncordoned, the pod starts on one of them."""
    node = release.node.name
    items = plane.get_json("vnpuallocations", "-A", "-l", f"{names.LABEL_NODE}={node}")["items"]
    used = [a["spec"]["chip"] for a in items]
    chips = plane.get_json(names.NODE_PLURAL, node)["status"]["chips"]
    roomy = [c["index"] for c in chips if used.count(c["index"]) < VNPUS_PER_CHIP]
    assert roomy, f"no room left on any chip: {used}"
    before = _live(plane)
    cordoned = [{"chip": index, "reason": "real-node test"} for index in roomy]
    plane.kubectl("patch", names.NODE_PLURAL, node, "--type=merge",
                  "-p", json.dumps({"spec": {"cordonedChips": cordoned}}))  # fmt: skip
    try:
        plane.apply(vnpu_busybox_pod("after-cordon", WORK, 1))

        def told() -> bool:
            pod = plane.get_json("pod", "after-cordon", "-n", WORK) or {}
            conditions = (pod.get("status") or {}).get("conditions") or []
            return any(
                c.get("type") == names.POD_COND_ALLOCATED and "cordoned" in c.get("message", "")
                for c in conditions
            )

        wait_for("the new pod told the chips are cordoned", told, timeout=60, interval=0.5)
        _pods_keep_their_devices(plane, before)
    finally:
        plane.kubectl("patch", names.NODE_PLURAL, node, "--type=merge",
                      "-p", '{"spec":{"cordonedChips":null}}')  # fmt: skip
    pod = running(plane, WORK, "after-cordon", timeout=120)
    (alloc,) = [
        a for a in plane.get_json("vnpuallocations", "-n", WORK)["items"]
        if a["spec"]["podUID"] == pod["metadata"]["uid"]
    ]  # fmt: skip
    assert alloc["spec"]["chip"] in roomy
    check_devices(plane, WORK, pod)


@dataclass
class Churn:
    """What the churn saw: every pod it created, refused creates (with the
    API server's answer), pods that never ran or never went, the instants
    (monotonic) each pod was created and was Running."""

    created: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    running_at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _churn(plane: LocalPlane, worker: int, stop: threading.Event, churn: Churn) -> None:
    """Creates a vNPU pod, waits for it to run, deletes it and waits for it to go,
    over and over until `stop`: one vNPU at a time per worker."""
    n = 0
    while not stop.is_set():
        name = f"churn-{worker}-{n}"
        n += 1
        text = yaml.safe_dump(vnpu_busybox_pod(name, WORK, 1))
        made = plane.kubectl("create", "-f", "-", input=text, check=False)
        if made.returncode != 0:
            with churn.lock:
                churn.refused.append(f"{name}: {made.stderr.strip()}")
            time.sleep(0.5)
            continue
        with churn.lock:
            churn.created.append(name)
        try:
            running(plane, WORK, name, timeout=120)
            with churn.lock:
                churn.running_at.append(time.monotonic())
        except AssertionError:
            with churn.lock:
                churn.stuck.append(f"{name}: never Running")
        plane.kubectl("delete", "pod", name, "-n", WORK, "--wait=false", check=False)
        gone = plane.kubectl("wait", "--for=delete", f"pod/{name}", "-n", WORK,
                             "--timeout=90s", check=False, timeout=120)  # fmt: skip
        if gone.returncode != 0:
            with churn.lock:
                churn.stuck.append(f"{name}: never gone ({gone.stderr.strip()})")


def test_helm_upgrade_during_a_churn_refuses_and_strands_nothing(
    plane: LocalPlane, release: Release
) -> None:
    """`helm upgrade` with a changed operator value while vNPU pods come and go:
    both operator replicas are replaced one at a time (RollingUpdate, the
    standby warm, the Lease handed over), the webhook answers every create,
    pods are placed during the rollout, and every pod runs and goes."""
    capacity = sum(parse_chips(CHIPS).values()) * VNPUS_PER_CHIP
    # Room for two churning pods: the earlier tests' one-vNPU pods make way.
    for name, ids in sorted(_live(plane).items()):
        held = sum(len(i) for i in _live(plane).values())
        if capacity - held >= 2:
            break
        if len(ids) == 1:
            plane.kubectl("delete", "pod", name, "-n", WORK, "--wait=true", timeout=120)
    before = _live(plane)
    held = sum(len(ids) for ids in before.values())
    wait_for("the freed vNPUs released",
             lambda: len(node_allocations(plane, release.node.name)) == held, 60)  # fmt: skip
    free = capacity - held
    assert free >= 2, f"no room for the churn: {before}"
    old_pods = {p["metadata"]["name"] for p in component_pods(plane, "operator")}
    lease = plane.get_json("lease", names.LEADER_LEASE_NAME, "-n", NAMESPACE)
    old_leader = lease["spec"]["holderIdentity"]
    assert old_leader in old_pods, (old_leader, old_pods)

    churn, stop = Churn(), threading.Event()
    workers = [
        threading.Thread(target=_churn, args=(plane, w, stop, churn), daemon=True) for w in range(2)
    ]
    for w in workers:
        w.start()
    try:
        wait_for("the churn running", lambda: len(churn.running_at) >= 2, 120, interval=0.5)
        t0 = time.monotonic()
        helm(plane, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
             "--set", "operator.logLevel=DEBUG")  # fmt: skip

        def rolled() -> bool:
            pods = component_pods(plane, "operator")
            names_now = {p["metadata"]["name"] for p in pods}
            return not names_now & old_pods and len(pods) == 2 and all(_ready(p) for p in pods)

        wait_for("both operator replicas replaced and Ready", rolled, 240, interval=0.5)
        rolled_at = time.monotonic()
        release.timings["helm_upgrade_rollout"] = rolled_at - t0
        # The churn goes on past the rollout: a placement after it proves the new leader.
        wait_for(
            "a pod Running after the rollout",
            lambda: any(t > rolled_at for t in churn.running_at),
            120,
            interval=0.5,
        )
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=300)
    during = [t for t in churn.running_at if t0 < t <= rolled_at]
    print(
        f"[realnode-chart] helm upgrade: rollout {rolled_at - t0:.1f}s, "
        f"{len(churn.created)} pods created, {len(during)} Running during the rollout, "
        f"{len(churn.refused)} refused"
    )
    assert not churn.refused, churn.refused
    assert not churn.stuck, churn.stuck
    assert during, "no pod was placed while the rollout ran: the test proved nothing"
    new_pods = component_pods(plane, "operator")
    for pod in new_pods:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        assert env.get("VNPU_LOG_LEVEL") == "DEBUG", env
        no_traceback(plane, pod["metadata"]["name"])
    holder = plane.get_json("lease", names.LEADER_LEASE_NAME, "-n", NAMESPACE)["spec"]
    assert holder["holderIdentity"] in {p["metadata"]["name"] for p in new_pods}, holder
    # The pods from before kept their devices; the churn's left nothing booked.
    _pods_keep_their_devices(plane, before)
    assert set(_live(plane)) == set(before)
    assert len(assert_books_agree(plane, release)) == held


def test_documented_uninstall_order_leaves_no_pod_and_no_vnpu(
    plane: LocalPlane, release: Release
) -> None:
    if not _live(plane):
        start_vnpu_pod(plane, release, "last", 1)
    assert node_allocations(plane, release.node.name)
    t0 = time.monotonic()
    _uninstall(plane, release)
    release.timings["documented_uninstall"] = time.monotonic() - t0

    def pods_left() -> list[str]:
        return [
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for ns in (WORK, NAMESPACE)
            for p in plane.get_json("pods", "-n", ns)["items"]
        ]

    wait_for("every pod gone (none stuck Terminating)", lambda: not pods_left(), 90, interval=1)
    assert not node_allocations(plane, release.node.name)
    assert not vnpu_ids(release.sim)
    assert not host_devices(release.node)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        assert plane.get_json(kind, names.WEBHOOK_CONFIG_NAME) is None, kind
    assert plane.get_json("runtimeclass", RUNTIME_CLASS) is None
    # Nothing of the release runs in containerd any more ...
    ours = _release_containers(release)
    running = {
        row.split()[0]
        for row in release.node.ctr("tasks", "ls").stdout.splitlines()[1:]
        if row.split() and row.split()[-1] == "RUNNING"
    }
    assert not ours & running, f"release containers still running: {ours & running}"
    # ... and the kubelet's container GC (every minute) removes their records.
    wait_for(
        "the release's stopped containers removed",
        lambda: not _release_containers(release),
        120,
        interval=2,
    )


def _release_containers(release: Release) -> set[str]:
    rows = release.node.ctr("containers", "ls").stdout.splitlines()[1:]
    return {row.split()[0] for row in rows if "vnpu-operator" in row}
