"""Device access follows declared ownership at the node (issue 33): no container
sees a vNPU its pod's allocations do not name, whatever its image, its envFrom
sources, a ConfigMap edited later or an ephemeral container say, and no
container makes the runtime create a vNPU behind the ledger.

The proof is `ls /dev` inside containers on the real node, under the Ascend
runtime stand-in, which behaves as the real runtime does where it matters: it
reads the container's final environment (image ENV included, the last
occurrence wins), checks no privilege, and creates a vNPU itself for
ASCEND_VNPU_SPECS even under VIRTUAL (the CDI mode's order). The attacker is a
tenant with the usual namespace rights (`edit`, plus pods/ephemeralcontainers
for kubectl debug) in a namespace of its own; the victim's vNPU pod runs in
another. Needs root; marker `realnode`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from realnode_harness import allocation_ids, check_devices, davinci, running, serving_vnpus
from realnode_harness import vnpu_busybox_pod as victim_pod
from tenant_harness import User, make_tenant

from localplane import LocalPlane, ociimage
from localplane.pods import vnpu_pod
from localplane.realnode import IMAGE_REPO, TEST_IMAGE, RealNode
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.realnode]

TEMPLATE = "vir05_1c_16g"
# Prints what the container sees, then stays (PID 1 ignores SIGTERM: 1 s grace).
SHOW = "ls /dev; exec sleep 3600"
EVIL_IMAGE = f"{IMAGE_REPO}/evil:1"


@dataclass(frozen=True)
class Victim:
    namespace: str
    vnpu_id: int


@pytest.fixture(scope="module")
def node(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    # Two 910B3 chips: eight vir05 vNPUs, room for the victim and every attacker.
    workdir = Path(tmp_path_factory.mktemp("isolation"))
    with serving_vnpus(plane, real_node, workdir, chips="910B3=2"):
        yield real_node


@pytest.fixture(scope="module")
def victim(plane: LocalPlane, node: RealNode) -> Iterator[Victim]:
    """Another tenant's running vNPU pod, and an image whose own ENV names its vNPU
    (and asks the runtime to create one, too)."""
    namespace = f"victim-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", namespace)
    wait_for(
        "ServiceAccount default",
        lambda: plane.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
        timeout=60,
    )
    plane.apply(victim_pod("victim", namespace, 1))
    ids = check_devices(plane, namespace, running(plane, namespace, "victim"))
    env = {
        "PATH": "/bin",
        names.ENV_VISIBLE_DEVICES: str(ids[0]),
        names.ENV_RUNTIME_OPTIONS: names.RUNTIME_OPTIONS_VIRTUAL,
        names.ENV_VNPU_SPECS: TEMPLATE,
    }
    archive = node.workdir / "images" / "evil.tar"
    layer = ociimage.busybox_layer(Path(node.tool("busybox")))
    ociimage.write_archive(archive, EVIL_IMAGE, layer, cmd=["sh"], env=env)
    node.import_image(archive)
    try:
        yield Victim(namespace, ids[0])
    finally:
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def tenant(plane: LocalPlane, namespace: str, tmp_path: Path) -> User:
    debug = ([""], ["pods/ephemeralcontainers"], ["get", "update", "patch"])
    return make_tenant(plane, namespace, tmp_path / "tenant.kubeconfig", [debug])


def box(name: str, image: str = TEST_IMAGE, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "imagePullPolicy": "Never",
            "command": ["sh", "-c", SHOW], **fields}  # fmt: skip


def attacker(
    name: str,
    namespace: str,
    containers: list[dict[str, Any]],
    init: Sequence[dict[str, Any]] = (),
    *,
    named: str = "main",
) -> dict[str, Any]:
    """A one-vNPU pod whose vNPU goes to container `named` only."""
    pod = vnpu_pod(name, namespace, template=TEMPLATE, count=1,
                   annotations={names.ANN_CONTAINERS: named},
                   spec={"terminationGracePeriodSeconds": 1})  # fmt: skip
    pod["spec"]["containers"] = containers
    pod["spec"]["initContainers"] = list(init)
    return pod


def seen(plane: LocalPlane, namespace: str, pod: str, container: str) -> set[str]:
    """The davinci devices container `container` listed in /dev (its current run)."""

    def listing() -> str | None:
        r = plane.kubectl("logs", "-n", namespace, pod, "-c", container, check=False)
        return r.stdout if r.returncode == 0 and "null" in r.stdout.split() else None

    return davinci(wait_for(f"{pod}/{container} listed /dev", listing, 60, interval=0.3))


def own(plane: LocalPlane, namespace: str, name: str) -> set[str]:
    pod = plane.get_json("pod", name, "-n", namespace)
    return {f"davinci{i}" for i in allocation_ids(plane, namespace, pod)}


def nothing_behind_the_ledger(plane: LocalPlane, node: RealNode) -> None:
    """No vNPU the runtime made itself, and every vNPU device node on the host is one
    an allocation names."""
    assert not (node.device_dir / "runtime-created.log").exists()
    allocs = plane.get_json("vnpuallocations", "-A")
    declared = {f"vdavinci{a['spec']['vnpuId']}" for a in allocs["items"]}
    assert {p.name for p in node.device_dir.glob("vdavinci*")} <= declared


def test_a_plain_pod_may_not_run_under_the_ascend_runtime(
    plane: LocalPlane, node: RealNode, victim: Victim, tenant: User
) -> None:
    """Route 1 for pods that ask for nothing: the image's ENV names the victim's vNPU.
    Under the Ascend RuntimeClass it would be mounted, so that class is refused to
    them; under the node's default runtime (runc) the variable means nothing."""
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
             "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 1,
                      "containers": [box("main", EVIL_IMAGE)]}}  # fmt: skip
    ascend = json.loads(json.dumps(plain))
    ascend["spec"]["runtimeClassName"] = "ascend"
    out = tenant.denied(
        "spec.runtimeClassName ascend: only pods that ask for vNPUs", "create", "-f", "-",
        input=json.dumps(ascend),
    )  # fmt: skip
    assert "ValidatingAdmissionPolicy" in out, out
    tenant.apply(plain)
    running(plane, tenant.namespace, "plain")
    assert seen(plane, tenant.namespace, "plain", "main") == set()
    nothing_behind_the_ledger(plane, node)


def test_an_image_env_names_no_foreign_vnpu_in_any_container(
    plane: LocalPlane, node: RealNode, victim: Victim, tenant: User
) -> None:
    """Route 1 for a vNPU pod, and the left-out containers: every container runs the
    image whose ENV names the victim's vNPU and asks for a vNPU of the runtime's own."""
    pod = attacker(
        "imaged", tenant.namespace,
        [box("main", EVIL_IMAGE), box("side", EVIL_IMAGE)],
        [box("init", EVIL_IMAGE, command=["ls", "/dev"])],
    )  # fmt: skip
    tenant.apply(pod)
    running(plane, tenant.namespace, "imaged")
    mine = own(plane, tenant.namespace, "imaged")
    assert len(mine) == 1
    assert f"davinci{victim.vnpu_id}" not in mine
    assert seen(plane, tenant.namespace, "imaged", "main") == mine
    assert seen(plane, tenant.namespace, "imaged", "side") == set()
    assert seen(plane, tenant.namespace, "imaged", "init") == set()
    nothing_behind_the_ledger(plane, node)


def test_env_from_names_no_foreign_vnpu_even_after_an_edit(
    plane: LocalPlane, node: RealNode, victim: Victim, tenant: User
) -> None:
    """Route 2: envFrom of a ConfigMap and a Secret, with and without a prefix, in the
    vNPU's container and in a left-out one; then a ConfigMap edited after admission,
    read when the containers start again."""
    theirs = str(victim.vnpu_id)
    keys = {names.ENV_VISIBLE_DEVICES: theirs, names.ENV_VNPU_SPECS: TEMPLATE,
            names.ENV_RUNTIME_OPTIONS: names.RUNTIME_OPTIONS_VIRTUAL}  # fmt: skip
    tenant.ok("create", "configmap", "later", "--from-literal=HARMLESS=1")
    tenant.ok(
        "create",
        "secret",
        "generic",
        "hidden",
        *[f"--from-literal={k}={v}" for k, v in keys.items()],
    )
    tenant.ok("create", "configmap", "prefixed", f"--from-literal=VISIBLE_DEVICES={theirs}",
              f"--from-literal=VNPU_SPECS={TEMPLATE}")  # fmt: skip
    sources = [
        {"configMapRef": {"name": "later"}},
        {"secretRef": {"name": "hidden"}},
        {"prefix": "ASCEND_", "configMapRef": {"name": "prefixed"}},
    ]
    tenant.apply(
        attacker("sourced", tenant.namespace,
                 [box("main", envFrom=sources), box("side", envFrom=sources)])
    )  # fmt: skip
    running(plane, tenant.namespace, "sourced")
    mine = own(plane, tenant.namespace, "sourced")
    assert f"davinci{victim.vnpu_id}" not in mine
    assert seen(plane, tenant.namespace, "sourced", "main") == mine
    assert seen(plane, tenant.namespace, "sourced", "side") == set()

    edited = {"data": keys}
    tenant.ok("patch", "configmap", "later", "--type=merge", "-p", json.dumps(edited))
    pod = plane.get_json("pod", "sourced", "-n", tenant.namespace)
    for status in pod["status"]["containerStatuses"]:
        node.ctr("tasks", "kill", "-s", "SIGKILL", status["containerID"].split("//")[-1])

    def restarted() -> bool:
        p = plane.get_json("pod", "sourced", "-n", tenant.namespace)
        return all(s.get("restartCount", 0) >= 1 and "running" in s.get("state", {})
                   for s in p["status"]["containerStatuses"])  # fmt: skip

    wait_for("both containers restarted", restarted, 60, interval=0.3)
    assert seen(plane, tenant.namespace, "sourced", "main") == mine
    assert seen(plane, tenant.namespace, "sourced", "side") == set()
    nothing_behind_the_ledger(plane, node)


def test_ephemeral_containers_get_no_vnpu(
    plane: LocalPlane, node: RealNode, victim: Victim, tenant: User
) -> None:
    """kubectl debug on the tenant's own vNPU pod, with the image that names the
    victim's vNPU, a raw ephemeral container with envFrom, and one naming the vNPU in
    its env: none sees a vNPU."""
    ns = tenant.namespace
    tenant.apply(attacker("host", ns, [box("main")]))
    running(plane, ns, "host")
    tenant.ok("debug", "host", "-c", "dbg", f"--image={EVIL_IMAGE}", "--image-pull-policy=Never",
              "--", "sh", "-c", SHOW)  # fmt: skip
    assert seen(plane, ns, "host", "dbg") == set()

    tenant.ok("create", "configmap", "theirs",
              f"--from-literal={names.ENV_VISIBLE_DEVICES}={victim.vnpu_id}")  # fmt: skip
    pod = plane.get_json("pod", "host", "-n", ns)
    raw = box("raw", envFrom=[{"configMapRef": {"name": "theirs"}}])
    raw["env"] = [{"name": names.ENV_RUNTIME_OPTIONS, "value": names.RUNTIME_OPTIONS_VIRTUAL}]
    pod["spec"]["ephemeralContainers"].append(raw)
    path = f"/api/v1/namespaces/{ns}/pods/host/ephemeralcontainers"
    tenant.ok("replace", "--raw", path, "-f", "-", input=json.dumps(pod))
    assert seen(plane, ns, "host", "raw") == set()

    # Naming the victim's vNPU outright: the webhook owns the variable in a new ephemeral
    # container of a vNPU pod, so the value written is the empty list.
    named = f"--env={names.ENV_VISIBLE_DEVICES}={victim.vnpu_id}"
    tenant.ok("debug", "host", "-c", "named", f"--image={TEST_IMAGE}", "--image-pull-policy=Never",
              named, "--", "sh", "-c", SHOW)  # fmt: skip
    assert seen(plane, ns, "host", "named") == set()
    assert seen(plane, ns, "host", "main") == own(plane, ns, "host")
    nothing_behind_the_ledger(plane, node)


def test_no_pod_may_set_vnpu_specs(plane: LocalPlane, node: RealNode, tenant: User) -> None:
    """ASCEND_VNPU_SPECS in a pod's own env is refused: by the device policy in a plain
    pod, by the webhook in a vNPU pod (the image and envFrom routes, which admission
    cannot see, are emptied by the webhook: the tests above)."""
    specs = [{"name": names.ENV_VNPU_SPECS, "value": TEMPLATE}]
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "specs"},
             "spec": {"containers": [box("main", env=specs)]}}  # fmt: skip
    out = tenant.denied(
        f"env {names.ENV_VNPU_SPECS}: no pod may set it", "create", "-f", "-",
        input=json.dumps(plain),
    )  # fmt: skip
    assert "ValidatingAdmissionPolicy" in out, out
    out = tenant.denied(
        f"spec.containers[0].env {names.ENV_VNPU_SPECS}: no pod may set it", "create", "-f",
        "-", input=json.dumps(attacker("specs", tenant.namespace, [box("main", env=specs)])),
    )  # fmt: skip
    assert names.WEBHOOK_MUTATE_NAME in out, out
    nothing_behind_the_ledger(plane, node)


def test_pod_security_baseline_closes_the_routes_around_the_runtime(
    plane: LocalPlane, node: RealNode, victim: Victim, tenant: User
) -> None:
    """A privileged container or the host's /dev opens every vNPU of the node whatever
    its env says: Pod Security `baseline` refuses both (SECURITY.md asks for it in
    tenant namespaces), and a vNPU pod runs, with its vNPU, even under `restricted`."""
    ns = tenant.namespace
    level = "pod-security.kubernetes.io/enforce"
    plane.kubectl("label", "namespace", ns, f"{level}=baseline")

    def plain(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeName": node.name, "containers": [container], **spec}}  # fmt: skip

    privileged = plain("privileged", box("main", securityContext={"privileged": True}))
    mount = {"name": "dev", "mountPath": "/host-dev"}
    host_dev = plain("hostdev", box("main", volumeMounts=[mount]),
                     volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}])  # fmt: skip
    for pod, why in ((privileged, "privileged"), (host_dev, "hostPath")):
        out = tenant.denied(why, "create", "-f", "-", input=json.dumps(pod))
        assert "violates PodSecurity" in out, out

    plane.kubectl("label", "namespace", ns, "--overwrite", f"{level}=restricted")
    strict = box("main", securityContext={
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}})  # fmt: skip
    pod = attacker("strict", ns, [strict])
    pod["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    tenant.apply(pod)
    running(plane, ns, "strict")
    mine = own(plane, ns, "strict")
    assert len(mine) == 1
    assert seen(plane, ns, "strict", "main") == mine
    nothing_behind_the_ledger(plane, node)
