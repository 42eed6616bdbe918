"""Nobody but the system may change what the system decided (issue 12): the chart's
protection policies, as the local plane installs them, tried by an attacker.

The tenant is a ServiceAccount with every right on pods in its namespace (plus
pods/status, bindings and vnpuallocations, so that those paths are tried too) and a
token kubeconfig. On a Running vNPU pod and on a gated one it tries, with every kind of
write kubectl offers, to point the pod at another pod's vNPU, start it before its vNPUs
exist, keep its vNPUs after the pod is gone, or change its request: each is refused with
a message naming the field. Harmless edits and deleting the pod still work, and the
lifecycle completes. An admin in an exempt group (system:masters) may make those edits.
Allocations are created by the operator only, with the node label equal to
spec.nodeName.

Node layout (prefix `pr-`): pr-a, 2 x 910B3, the only node with an agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import (
    Stack,
    StackOf,
    get_json,
    pod_allocations,
    pod_gone,
    pod_running,
    pod_waiting,
)
from tenant_harness import ONLY_OPERATOR, User, make_tenant

from localplane import LocalPlane, NodeSpec
from localplane.components import vnpu_ids
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names
from vnpu_operator.admission.mutation import VISIBLE_DEVICES_FIELD_PATH

# k8s134: also run on the 1.34 lane (`make test-k8s134`), since it depends on the API
# server's or the scheduler's version.
pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

NODE = "pr-a"
TEMPLATE = "vir05_1c_16g"
BIG = "vir10_3c_32g"  # 2 per 910B3 chip: 8 of them never fit on pr-a
REQUEST_KEYS = (names.ANN_TEMPLATE, names.ANN_COUNT, names.ANN_CHIP_MODEL, names.ANN_CONTAINERS)


# How the pod policy names what it refused.
ANN = "metadata.annotations[{}]"
VISIBLE = ANN.format(names.ANN_VISIBLE_DEVICES)
GATE = f"spec.schedulingGates[{names.SCHEDULING_GATE}]"
FINALIZER = f"metadata.finalizers[{names.POD_FINALIZER}]"


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name=NODE, chips={"910B3": 2})],
    )


@pytest.fixture
def tenant(plane: LocalPlane, namespace: str, tmp_path: Path) -> User:
    rights = [
        (
            [""],
            ["pods"],
            ["get", "list", "watch", "create", "update", "patch", "delete"],
        ),
        ([""], ["pods/status"], ["get", "update", "patch"]),
        ([""], ["pods/binding", "bindings"], ["create"]),
        ([""], ["pods/ephemeralcontainers"], ["get", "update", "patch"]),
        ([names.GROUP], [names.ALLOCATION_PLURAL], ["get", "list", "create", "update", "patch"]),
    ]
    # The namespace's `edit` rights, and more than an ordinary tenant gets: the
    # subresources that can change metadata, and allocations.
    return make_tenant(plane, namespace, tmp_path / "tenant.kubeconfig", rights)


@pytest.fixture
def admin(plane: LocalPlane, namespace: str) -> User:
    """The plane's admin: group system:masters, exempt from the pod protection."""
    return User(plane, plane.kubeconfig, namespace)


def pod_of(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    pod = get_json(plane, "pod", "-n", namespace, name)
    assert pod is not None, f"pod {namespace}/{name} is gone"
    return dict(pod)


def running(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    return pod_running(plane, namespace, name, timeout=90, interval=0.5)


def waiting(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    """The pod once the operator said it waits for capacity (so it stays gated)."""
    pod_waiting(plane, namespace, name, timeout=90, interval=0.5)
    pod: dict[str, Any] = get_json(plane, "pod", "-n", namespace, name)
    return pod


def gone(plane: LocalPlane, namespace: str, name: str) -> None:
    pod_gone(plane, namespace, name, timeout=90)


def visible(pod: dict[str, Any]) -> str | None:
    value = (pod["metadata"].get("annotations") or {}).get(names.ANN_VISIBLE_DEVICES)
    return None if value is None else str(value)


def gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] == names.SCHEDULING_GATE for g in pod["spec"].get("schedulingGates", []))


def create_as(user: User, pod: dict[str, Any]) -> None:
    user.ok("create", "-f", "-", input=yaml.safe_dump(pod))


def replaced(pod: dict[str, Any], change: Any) -> str:
    """The pod as read, changed by `change(pod)`, for a full update (PUT). Without its
    resourceVersion (pods allow unconditional updates), so that a status write meanwhile
    cannot turn the refusal into a conflict."""
    body = json.loads(json.dumps(pod))
    del body["metadata"]["resourceVersion"]
    change(body)
    return json.dumps(body)


def request_edits(user: User, pod: dict[str, Any]) -> None:
    """Every change of the request annotations `user` can try on `pod`: each is refused."""
    name = pod["metadata"]["name"]
    present = pod["metadata"]["annotations"]
    other = {
        names.ANN_TEMPLATE: TEMPLATE if present[names.ANN_TEMPLATE] == BIG else BIG,
        names.ANN_COUNT: "2",
        names.ANN_CHIP_MODEL: "310P3",
        names.ANN_CONTAINERS: "other",
    }
    for key in REQUEST_KEYS:
        field = ANN.format(key)
        pointer = "/metadata/annotations/" + key.replace("/", "~1")
        user.refused(field, "annotate", "pod", name, "--overwrite", f"{key}={other[key]}")
        if key in present:
            user.refused(field, "annotate", "pod", name, f"{key}-")
            user.refused(
                field, *user.patch(name, "merge", {"metadata": {"annotations": {key: None}}})
            )
            user.refused(field, *user.patch(name, "json", [{"op": "remove", "path": pointer}]))
        else:
            user.refused(
                field,
                *user.patch(name, "json", [{"op": "add", "path": pointer, "value": other[key]}]),
            )
    field = ANN.format(names.ANN_TEMPLATE)
    user.refused(
        field,
        "replace",
        "-f",
        "-",
        input=replaced(pod, lambda p: p["metadata"]["annotations"].pop(names.ANN_TEMPLATE)),
    )


def finalizer_edits(user: User, pod: dict[str, Any]) -> None:
    name = pod["metadata"]["name"]
    index = pod["metadata"]["finalizers"].index(names.POD_FINALIZER)
    user.refused(
        FINALIZER,
        *user.patch(name, "json", [{"op": "remove", "path": f"/metadata/finalizers/{index}"}]),
    )
    user.refused(FINALIZER, *user.patch(name, "merge", {"metadata": {"finalizers": None}}))
    user.refused(
        FINALIZER,
        *user.patch(
            name,
            "strategic",
            {"metadata": {"$deleteFromPrimitiveList/finalizers": [names.POD_FINALIZER]}},
        ),
    )
    user.refused(
        FINALIZER,
        "replace",
        "-f",
        "-",
        input=replaced(pod, lambda p: p["metadata"].__setitem__("finalizers", [])),
    )
    # A status write may change metadata too.
    user.refused(
        FINALIZER,
        *user.patch(name, "merge", {"metadata": {"finalizers": None}}, "--subresource=status"),
    )


def harmless_edits(user: User, name: str) -> None:
    user.ok("label", "pod", name, "tenant.example/owner=me")
    user.ok("annotate", "pod", name, "tenant.example/note=fine")
    user.ok(*user.patch(name, "merge", {"metadata": {"annotations": {"tenant.example/n": "2"}}}))
    # Through pods/status: the path is open for metadata, closed only for ours.
    user.ok(
        *user.patch(
            name,
            "merge",
            {"metadata": {"annotations": {"tenant.example/status": "ok"}}},
            "--subresource=status",
        )
    )


def allocation(name: str, namespace: str, *, node: str, label: str | None) -> str:
    labels = {} if label is None else {names.LABEL_NODE: label}
    return yaml.safe_dump(
        {
            "apiVersion": names.API_VERSION,
            "kind": names.ALLOCATION_KIND,
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "podName": "p",
                "podUID": "uid-p",
                "nodeName": node,
                "chip": 0,
                "template": TEMPLATE,
                "vnpuId": names.VNPU_ID_MIN,
            },
        }
    )


def test_allocations_are_the_operators(
    plane: LocalPlane, tenant: User, admin: User, namespace: str
) -> None:
    """First in the module, before the Stack starts: an operator would release an
    allocation of a pod it does not know while this test still works on it."""
    ns = namespace
    # Nobody served by an agent: these allocations make no vNPU.
    node = "pr-nowhere"
    body = allocation("handmade", ns, node=node, label=node)
    for user in (tenant, admin):
        user.denied(
            "VNPUAllocations are created by the vnpu-operator only", "create", "-f", "-",
            input=body,
        )  # fmt: skip
    operator = User(plane, plane.operator_kubeconfig, ns)
    mismatch = f"metadata.labels[{names.LABEL_NODE}] must equal spec.nodeName ({node})"
    for label in ("pr-elsewhere", None):
        operator.denied(
            mismatch, "create", "-f", "-",
            input=allocation("mislabelled", ns, node=node, label=label),
        )  # fmt: skip

    operator.ok("create", "-f", "-", input=body)
    # As the operator makes them: with the finalizer only the agent's destroy removes.
    operator.ok(
        "patch", names.ALLOCATION_PLURAL, "handmade", "--type=merge",
        "-p", json.dumps({"metadata": {"finalizers": [names.ALLOCATION_FINALIZER]}}),
    )  # fmt: skip
    relabel = ("label", names.ALLOCATION_PLURAL, "handmade", "--overwrite")
    for user in (admin, operator):
        user.denied(mismatch, *relabel, f"{names.LABEL_NODE}=pr-elsewhere")
        user.denied(mismatch, *relabel, f"{names.LABEL_NODE}-")
    # Nobody else changes an allocation's metadata or status, not even an exempt admin,
    # who may only remove its finalizer (the documented way out, docs/HELM.md).
    for user in (tenant, admin):
        user.denied(
            "metadata.labels of a VNPUAllocation",
            "label", names.ALLOCATION_PLURAL, "handmade", "tenant.example/owner=me",
        )  # fmt: skip
        user.denied(
            "metadata.annotations of a VNPUAllocation",
            "annotate", names.ALLOCATION_PLURAL, "handmade", "tenant.example/note=x",
        )  # fmt: skip
        user.denied(
            "metadata.finalizers: none may be added",
            "patch", names.ALLOCATION_PLURAL, "handmade", "--type=merge", "-p",
            json.dumps({"metadata": {"finalizers": [names.ALLOCATION_FINALIZER, "x.example/k"]}}),
        )  # fmt: skip
    admin.denied(
        "status of a VNPUAllocation",
        "patch", names.ALLOCATION_PLURAL, "handmade", "--type=merge", "--subresource=status",
        "-p", json.dumps({"status": {"phase": "Ready"}}),
    )  # fmt: skip
    tenant.denied(
        "metadata.finalizers of a VNPUAllocation",
        "patch", names.ALLOCATION_PLURAL, "handmade", "--type=merge",
        "-p", json.dumps({"metadata": {"finalizers": None}}),
    )  # fmt: skip
    admin.ok(
        "patch", names.ALLOCATION_PLURAL, "handmade", "--type=merge",
        "-p", json.dumps({"metadata": {"finalizers": None}}),
    )  # fmt: skip
    tenant.ok("get", names.ALLOCATION_PLURAL, "handmade")
    admin.ok("delete", names.ALLOCATION_PLURAL, "handmade")


def test_tenant_cannot_take_another_pods_vnpu_or_keep_its_own(
    plane: LocalPlane, stack: Stack, tenant: User, namespace: str
) -> None:
    ns = namespace
    create_as(tenant, vnpu_pod("victim", ns, template=TEMPLATE))
    create_as(
        tenant,
        vnpu_pod(
            "thief",
            ns,
            template=TEMPLATE,
            count=1,
            chip_model="910B3",
            annotations={names.ANN_CONTAINERS: "main"},
        ),
    )
    victim = running(plane, ns, "victim")
    thief = running(plane, ns, "thief")
    theirs, mine = visible(victim), visible(thief)
    assert theirs, victim
    assert mine, thief
    assert theirs != mine

    pointer = "/metadata/annotations/" + names.ANN_VISIBLE_DEVICES.replace("/", "~1")
    for args in (
        ("annotate", "pod", "thief", "--overwrite", f"{names.ANN_VISIBLE_DEVICES}={theirs}"),
        ("annotate", "pod", "thief", f"{names.ANN_VISIBLE_DEVICES}-"),
        tenant.patch("thief", "json", [{"op": "replace", "path": pointer, "value": theirs}]),
        tenant.patch("thief", "json", [{"op": "remove", "path": pointer}]),
        tenant.patch(
            "thief", "merge", {"metadata": {"annotations": {names.ANN_VISIBLE_DEVICES: theirs}}}
        ),
        tenant.patch(
            "thief",
            "strategic",
            {"metadata": {"annotations": {names.ANN_VISIBLE_DEVICES: f"{mine},{theirs}"}}},
        ),
        tenant.patch(
            "thief",
            "merge",
            {"metadata": {"annotations": {names.ANN_VISIBLE_DEVICES: theirs}}},
            "--subresource=status",
        ),
    ):
        tenant.refused(VISIBLE, *args)
    tenant.refused(
        VISIBLE,
        "replace",
        "-f",
        "-",
        input=replaced(
            thief,
            lambda p: p["metadata"]["annotations"].__setitem__(names.ANN_VISIBLE_DEVICES, theirs),
        ),
    )
    request_edits(tenant, thief)
    finalizer_edits(tenant, thief)
    harmless_edits(tenant, "thief")

    # Nothing changed what the containers read or what the system decided.
    after = pod_of(plane, ns, "thief")
    assert visible(after) == mine
    assert after["metadata"]["labels"]["tenant.example/owner"] == "me"
    assert after["metadata"]["annotations"]["tenant.example/status"] == "ok"
    for key in REQUEST_KEYS:
        assert after["metadata"]["annotations"][key] == thief["metadata"]["annotations"][key]
    assert names.POD_FINALIZER in after["metadata"]["finalizers"]
    (alloc,) = pod_allocations(plane, ns, after["metadata"]["uid"])
    assert str(alloc["spec"]["vnpuId"]) == mine

    # Deleting is never blocked, and the release completes: the agent destroys the vNPU
    # and removes the allocation's finalizer, the operator the pod's.
    uids = [p["metadata"]["uid"] for p in (victim, thief)]
    tenant.ok("delete", "pod", "thief", "victim", "--wait=false")
    gone(plane, ns, "thief")
    gone(plane, ns, "victim")
    wait_for(
        "allocations gone",
        lambda: all(not pod_allocations(plane, ns, uid) for uid in uids),
        timeout=60,
    )
    wait_for("no vNPU left", lambda: not vnpu_ids(stack.agent.sim(NODE)), timeout=60)


DEVICE_ENV = f"env {names.ENV_VISIBLE_DEVICES}"


def test_no_route_hands_one_vnpu_to_two_pods(
    plane: LocalPlane, stack: Stack, tenant: User, admin: User, namespace: str
) -> None:
    """Issue 33, item 3: a pod keeps its vNPU open while its allocation goes without the
    destroy (a tenant pointing the owner at a pod that does not exist and removing the
    finalizer; an admin deleting the allocation and removing the finalizer by hand as
    docs/HELM.md says). The tenant is refused; after the admin's way, the vNPU's id stays
    booked until the vNPU is destroyed, and the next pod gets another one."""
    ns = namespace
    sim = stack.agent.sim(NODE)
    create_as(tenant, vnpu_pod("holder", ns, template=TEMPLATE))
    holder = running(plane, ns, "holder")
    (alloc,) = pod_allocations(plane, ns, holder["metadata"]["uid"])
    name, held = alloc["metadata"]["name"], int(alloc["spec"]["vnpuId"])
    sim.open_vnpu(held)  # the container has it open

    where = ("patch", names.ALLOCATION_PLURAL, name, "--type=merge", "-p")
    ghost = {"apiVersion": "v1", "kind": "Pod", "name": "ghost",
             "uid": "00000000-0000-4000-8000-000000000000"}  # fmt: skip
    tenant.denied(
        "metadata.ownerReferences of a VNPUAllocation",
        *where, json.dumps({"metadata": {"ownerReferences": [ghost]}}),
    )  # fmt: skip
    tenant.denied(
        "metadata.finalizers of a VNPUAllocation",
        *where, json.dumps({"metadata": {"finalizers": None}}),
    )  # fmt: skip

    # The admin's way: the allocation deleted, its destroy deferred (the vNPU is
    # open), the finalizer removed by hand.
    admin.ok("delete", names.ALLOCATION_PLURAL, name, "--wait=false")
    wait_for(
        "destroy deferred",
        lambda: (get_json(plane, names.ALLOCATION_PLURAL, "-n", ns, name) or {})
        .get("status", {}).get("phase") == names.PHASE_RELEASING,
        timeout=30,
    )  # fmt: skip
    admin.ok(*where, json.dumps({"metadata": {"finalizers": None}}))
    wait_for(
        "allocation gone",
        lambda: get_json(plane, names.ALLOCATION_PLURAL, "-n", ns, name) is None,
        timeout=30,
    )
    assert held in vnpu_ids(sim)

    create_as(tenant, vnpu_pod("next", ns, template=TEMPLATE))
    nxt = running(plane, ns, "next")
    (mine,) = pod_allocations(plane, ns, nxt["metadata"]["uid"])
    assert int(mine["spec"]["vnpuId"]) != held
    assert str(held) not in (visible(nxt) or "").split(",")

    # The container lets go; the agent collects the orphan, and the id is free again.
    sim.release_vnpu(held)
    wait_for("orphan collected", lambda: held not in vnpu_ids(sim), timeout=30)
    create_as(tenant, vnpu_pod("after", ns, template=TEMPLATE))
    after = running(plane, ns, "after")
    (theirs,) = pod_allocations(plane, ns, after["metadata"]["uid"])
    assert int(theirs["spec"]["vnpuId"]) == held  # the lowest free id of the fuller chip

    tenant.ok("delete", "pod", "holder", "next", "after", "--wait=false")
    for pod in ("holder", "next", "after"):
        gone(plane, ns, pod)
    wait_for(
        "vNPUs destroyed",
        lambda: not {int(mine["spec"]["vnpuId"]), held} & set(vnpu_ids(sim)),
        timeout=30,
    )


def with_env(pod: dict[str, Any], container: int, env: list[dict[str, Any]], *,
             init: bool = False) -> dict[str, Any]:  # fmt: skip
    pod["spec"]["initContainers" if init else "containers"][container]["env"] = env
    return pod


def test_no_pod_names_vnpu_devices_but_through_the_operator(
    plane: LocalPlane, stack: Stack, tenant: User, namespace: str
) -> None:
    """The Ascend runtime gives a container what its ASCEND_VISIBLE_DEVICES names. A pod
    that never asked for vNPUs, a container the request left out, or an ephemeral
    container added later would otherwise reach any vNPU of the node by its id."""
    ns = namespace
    create_as(tenant, vnpu_pod("victim", ns, template=TEMPLATE))
    victim = running(plane, ns, "victim")
    theirs = visible(victim)
    assert theirs, victim
    literal = [{"name": names.ENV_VISIBLE_DEVICES, "value": theirs}]
    from_annotation = [
        {
            "name": names.ENV_VISIBLE_DEVICES,
            "valueFrom": {"fieldRef": {"fieldPath": VISIBLE_DEVICES_FIELD_PATH}},
        }
    ]
    from_label = [
        {
            "name": names.ENV_VISIBLE_DEVICES,
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['devices']"}},
        }
    ]

    def create_refused(field: str, pod: dict[str, Any]) -> None:
        tenant.refused(field, "create", "-f", "-", input=yaml.safe_dump(pod))

    def plain(name: str) -> dict[str, Any]:
        return vnpu_pod(
            name, ns, template=None, containers=["main", "side"], init_containers=["setup"]
        )

    # A pod that does not ask for vNPUs: no literal, no other field, in any container.
    create_refused(DEVICE_ENV, with_env(plain("p1"), 0, literal))
    create_refused(DEVICE_ENV, with_env(plain("p2"), 1, from_label))
    create_refused(DEVICE_ENV, with_env(plain("p3"), 0, literal, init=True))
    # Nor the operator's annotation, set at creation, for the webhook's env to read.
    create_refused(
        VISIBLE,
        with_env(
            vnpu_pod("p4", ns, template=None, annotations={names.ANN_VISIBLE_DEVICES: theirs}),
            0,
            from_annotation,
        ),
    )
    for name in ("p1", "p2", "p3", "p4"):
        assert get_json(plane, "pod", "-n", ns, name) is None, name
    # A vNPU pod: the container its request leaves out names no device either; the
    # system owns the variable there too, so the webhook empties it.
    left_out = vnpu_pod("p5", ns, template=TEMPLATE, containers=["main", "side"],
                        annotations={names.ANN_CONTAINERS: "main"})  # fmt: skip
    create_as(tenant, with_env(left_out, 1, literal))
    side = pod_of(plane, ns, "p5")["spec"]["containers"][1]
    assert [e for e in side["env"] if e["name"] == names.ENV_VISIBLE_DEVICES] == [
        {"name": names.ENV_VISIBLE_DEVICES}
    ]
    tenant.ok("delete", "pod", "p5", "--wait=false")

    # A plain pod that reads the annotation (empty) is fine; adding the annotation later
    # would hand its next container start the victim's vNPU.
    create_as(tenant, with_env(vnpu_pod("reader", ns, template=None), 0, from_annotation))
    reader = running(plane, ns, "reader")
    tenant.refused(VISIBLE, "annotate", "pod", "reader", f"{names.ANN_VISIBLE_DEVICES}={theirs}")
    tenant.refused(
        VISIBLE,
        *tenant.patch(
            "reader",
            "merge",
            {"metadata": {"annotations": {names.ANN_VISIBLE_DEVICES: theirs}}},
            "--subresource=status",
        ),
    )
    harmless_edits(tenant, "reader")

    # Ephemeral containers (kubectl debug) run with the pod's runtime too.
    def debug(pod: dict[str, Any], env: list[dict[str, Any]]) -> tuple[int, str]:
        body = json.loads(json.dumps(pod))
        del body["metadata"]["resourceVersion"]
        body["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox", "env": env}]
        path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/ephemeralcontainers"
        return tenant.kubectl("replace", "--raw", path, "-f", "-", input=json.dumps(body))

    for env in (literal, from_label):
        rc, out = debug(reader, env)
        assert rc != 0, out
        assert DEVICE_ENV in out, out
        assert ONLY_OPERATOR in out, out
    # On a vNPU pod the webhook owns the variable in a new ephemeral container too: its
    # value, whatever the tenant wrote, is the empty list.
    rc, out = debug(pod_of(plane, ns, "victim"), literal)
    assert rc == 0, out
    (debugger,) = pod_of(plane, ns, "victim")["spec"]["ephemeralContainers"]
    assert {e["name"]: e for e in debugger["env"]}[names.ENV_VISIBLE_DEVICES] == {
        "name": names.ENV_VISIBLE_DEVICES
    }
    rc, out = debug(pod_of(plane, ns, "reader"), [{"name": "HARMLESS", "value": "1"}])
    assert rc == 0, out
    # A pod an exempt admin made with a literal value (say, to try a runtime by hand)
    # still gets its status written (a kubelet is no admin) and its debug containers.
    admin = User(plane, plane.kubeconfig, ns)
    create_as(admin, with_env(vnpu_pod("by-hand", ns, template=None), 0, literal))
    tenant.ok(
        *tenant.patch(
            "by-hand", "merge", {"status": {"conditions": [
                {"type": "example.com/Checked", "status": "True"}]}},
            "--subresource=status",
        )
    )  # fmt: skip
    rc, out = debug(pod_of(plane, ns, "by-hand"), [{"name": "HARMLESS", "value": "1"}])
    assert rc == 0, out
    after = pod_of(plane, ns, "reader")
    assert [c["name"] for c in after["spec"]["ephemeralContainers"]] == ["debugger"]
    assert visible(after) is None
    assert visible(pod_of(plane, ns, "victim")) == theirs


def test_tenant_cannot_start_a_gated_pod_or_change_its_request(
    plane: LocalPlane, stack: Stack, tenant: User, namespace: str
) -> None:
    ns = namespace
    create_as(tenant, vnpu_pod("held", ns, template=BIG, count=8))
    held = waiting(plane, ns, "held")
    assert gated(held)

    index = [g["name"] for g in held["spec"]["schedulingGates"]].index(names.SCHEDULING_GATE)
    for args in (
        tenant.patch("held", "json", [{"op": "remove", "path": f"/spec/schedulingGates/{index}"}]),
        tenant.patch(
            "held", "json", [{"op": "replace", "path": "/spec/schedulingGates", "value": []}]
        ),
        tenant.patch("held", "merge", {"spec": {"schedulingGates": None}}),
        tenant.patch(
            "held",
            "strategic",
            {"spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE, "$patch": "delete"}]}},
        ),
    ):
        tenant.refused(GATE, *args)
    tenant.refused(
        GATE,
        "replace",
        "-f",
        "-",
        input=replaced(held, lambda p: p["spec"].__setitem__("schedulingGates", [])),
    )
    # A vNPU id before the operator chose one.
    tenant.refused(
        VISIBLE, "annotate", "pod", "held", f"{names.ANN_VISIBLE_DEVICES}={names.VNPU_ID_MIN}"
    )
    request_edits(tenant, held)
    finalizer_edits(tenant, held)
    harmless_edits(tenant, "held")

    after = pod_of(plane, ns, "held")
    assert gated(after)
    assert visible(after) is None
    assert not after["spec"].get("nodeName")
    assert names.POD_FINALIZER in after["metadata"]["finalizers"]
    assert after["metadata"]["annotations"][names.ANN_COUNT] == "8"

    tenant.ok("delete", "pod", "held", "--wait=false")
    gone(plane, ns, "held")


def test_a_binding_may_not_carry_the_vnpu_annotations(
    plane: LocalPlane, stack: Stack, tenant: User, namespace: str
) -> None:
    """A Binding's annotations are copied onto the pod it binds: an ungated pod that the
    scheduler cannot place (it asks for more CPU than any node has) is still open to one."""
    ns = namespace
    create_as(
        tenant,
        vnpu_pod(
            "unbound",
            ns,
            template=TEMPLATE,
            spec={
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1000"}}}
                ]
            },
        ),
    )

    def ungated() -> dict[str, Any] | None:
        pod = pod_of(plane, ns, "unbound")
        return pod if visible(pod) and not gated(pod) else None

    pod = wait_for("pod ungated", ungated, timeout=90, interval=0.5)
    assert not pod["spec"].get("nodeName")
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "unbound",
            "namespace": ns,
            "annotations": {names.ANN_VISIBLE_DEVICES: str(names.VNPU_ID_MAX)},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    }
    refusal = "a Binding may not set the vnpu.io annotations"
    # --validate=false: kubectl's own check of a Binding lists CRDs, which a tenant may not.
    tenant.denied(refusal, "create", "--validate=false", "-f", "-", input=json.dumps(binding))
    path = f"/api/v1/namespaces/{ns}/pods/unbound/binding"
    source = tenant.kubeconfig.parent / "binding.json"
    source.write_text(json.dumps(binding))
    tenant.denied(refusal, "create", "--raw", path, "-f", str(source))
    after = pod_of(plane, ns, "unbound")
    assert visible(after) == visible(pod)
    assert not after["spec"].get("nodeName")
    tenant.ok("delete", "pod", "unbound", "--wait=false")
    gone(plane, ns, "unbound")


def test_an_exempt_admin_may_edit_by_hand(
    plane: LocalPlane, stack: Stack, admin: User, namespace: str
) -> None:
    """The escape hatch: members of protection.exemptGroups (system:masters here) may
    change what the operator decided, e.g. to unstick a pod."""
    ns = namespace
    create_as(admin, vnpu_pod("stuck", ns, template=BIG, count=8))
    waiting(plane, ns, "stuck")
    admin.ok("annotate", "pod", "stuck", f"{names.ANN_VISIBLE_DEVICES}={names.VNPU_ID_MAX}")
    # No node has a 310P3: the request still fits nowhere, so the operator stays out.
    admin.ok("annotate", "pod", "stuck", f"{names.ANN_CHIP_MODEL}=310P3")
    # The two commands docs/HELM.md gives for unsticking a pod.
    admin.ok(
        *admin.patch(
            "stuck",
            "strategic",
            {"metadata": {"$deleteFromPrimitiveList/finalizers": [names.POD_FINALIZER]}},
        )
    )
    admin.ok(
        *admin.patch(
            "stuck",
            "strategic",
            {"spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE, "$patch": "delete"}]}},
        )
    )
    after = pod_of(plane, ns, "stuck")
    assert not gated(after)
    assert names.POD_FINALIZER not in (after["metadata"].get("finalizers") or [])
    assert visible(after) == str(names.VNPU_ID_MAX)
    admin.ok("delete", "pod", "stuck", "--wait=false")
    gone(plane, ns, "stuck")


def test_a_pod_asking_for_no_vnpus_may_not_request_vnpu_resources(tenant: User) -> None:
    """They are what quota counts and node capacity the ledger books: a pod taking them
    past the webhook would hold room the ledger does not know of."""
    # (Requests alone are invalid for an extended resource: limits default them.)
    for sections in (("limits",), ("requests", "limits")):
        plain = vnpu_pod("plain", tenant.namespace, template=None)
        plain["spec"]["containers"][0]["resources"] = {
            s: {names.RES_AICORE: "40"} for s in sections
        }
        tenant.denied(
            "resources vnpu.io/vnpus, vnpu.io/aicore, vnpu.io/memory-mb: only the "
            "vnpu-operator's webhook sets them",
            "create", "-f", "-", input=json.dumps(plain),
        )  # fmt: skip
    plain = vnpu_pod("plain", tenant.namespace, template=None)
    plain["spec"]["initContainers"] = [
        {"name": "i", "image": "busybox", "resources": {"limits": {names.RES_VNPUS: "1"}}}
    ]
    tenant.denied("only the vnpu-operator's webhook sets them", "create", "-f", "-",
                  input=json.dumps(plain))  # fmt: skip
    # Beside a vnpu.io/<template> request, which the webhook serves (here by the annotation
    # path), a charge the pod wrote is replaced by its true one.
    both = vnpu_pod("plain", tenant.namespace, template=None)
    both["spec"]["containers"][0]["resources"] = {
        "limits": {names.template_resource("vir05_1c_16g"): "1", names.RES_VNPUS: "7"}
    }
    out = tenant.ok("create", "-f", "-", "--dry-run=server", "-o", "json",
                    input=json.dumps(both))  # fmt: skip
    made = json.loads(out[out.index("{") : out.rindex("}") + 1])  # kubectl's warnings aside
    assert made["spec"]["containers"][0]["resources"]["limits"][names.RES_VNPUS] == "1"
    # Other extended resources are not ours to judge.
    plain = vnpu_pod("plain", tenant.namespace, template=None)
    plain["spec"]["containers"][0]["resources"] = {"limits": {"example.com/foo": "1"}}
    tenant.ok("create", "-f", "-", "--dry-run=server", input=json.dumps(plain))
