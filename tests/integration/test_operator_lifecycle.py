"""The pod lifecycle of docs/ARCHITECTURE.md through the real operator,
agent, webhooks and control plane: admission, mutation, placement of several
vNPUs, waiting and event-driven retry, terminal pods, container restarts,
idle vNPUs across many GC grace periods, allocations deleted by hand, and the
metrics that describe all of it.

Node layout (names unique to this file, prefix `lc-`):
- lc-a: 2 x 910B3, untainted: where pods without a nodeSelector land (lc-p
  offers no 910B3 template and every other node is tainted);
- lc-3, lc-b, lc-m: 910B3 nodes tainted `lc-reserved=<node>:NoSchedule`, each
  kept for one test so it can assert on the node's whole simulated state;
- lc-p: 1 x 310P3, so what the cluster offers spans two chip models.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from operator_harness import (
    Stack,
    StackOf,
    get_pod,
    pod_allocations,
    pod_events,
    pod_running,
    sim_vnpus,
    wait_event,
)
from prometheus_client.parser import text_string_to_metric_families

from localplane import LocalPlane, NodeSpec
from localplane.components import AgentProcess, vnpu_ids
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names
from vnpu_operator.admission.mutation import VISIBLE_DEVICES_FIELD_PATH

pytestmark = pytest.mark.plane

TEMPLATE = "vir05_1c_16g"
BIG_TEMPLATE = "vir10_3c_32g"
RESERVED = "lc-reserved"
# The agent's timing in the Stack.
GC_GRACE_SECONDS = float(AgentProcess.QUICK["gc-grace-seconds"])
RESYNC_SECONDS = float(AgentProcess.QUICK["resync-seconds"])


def _reserved(node: str) -> NodeSpec:
    return NodeSpec(
        name=node,
        chips={"910B3": 2 if node == "lc-3" else 1},
        taints=[{"key": RESERVED, "value": node, "effect": "NoSchedule"}],
    )


@pytest.fixture(scope="module")
def stack(plane: LocalPlane, stack_of: StackOf) -> Stack:
    nodes = [
        NodeSpec(name="lc-a", chips={"910B3": 2}),
        _reserved("lc-3"),
        _reserved("lc-b"),
        _reserved("lc-m"),
        NodeSpec(name="lc-p", chips={"310P3": 1}),
    ]
    s = stack_of(nodes)
    # The webhook checks against what the operator's cache says the cluster
    # offers: wait until that covers every node's chips, probed by a
    # server-side dry run (webhooks run, nothing is stored).
    probe = vnpu_pod("lc-probe", "default", chip_model="lc-probe-model")

    def offers_both_models() -> bool:
        r = plane.kubectl(
            "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe), check=False
        )
        return "known models:" in r.stderr and "910B3" in r.stderr and "310P3" in r.stderr

    wait_for("webhook knows every chip model", offers_both_models, timeout=60, interval=0.5)
    return s


# ---------------------------------------------------------------- helpers


def tolerate(manifest: dict[str, Any], node: str) -> dict[str, Any]:
    """Tolerates the taint of one reserved node (selecting it is up to the caller)."""
    spec = manifest["spec"]
    spec.setdefault("tolerations", []).append(
        {"key": RESERVED, "operator": "Equal", "value": node, "effect": "NoSchedule"}
    )
    return manifest


def apply_rejected(plane: LocalPlane, manifest: dict[str, Any]) -> str:
    """Creates `manifest`, expects the API server to refuse it, returns why."""
    r = plane.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert r.returncode != 0, f"pod was admitted: {r.stdout}"
    return r.stderr


def pod_condition(pod: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def allocated_status(plane: LocalPlane, ns: str, name: str) -> str | None:
    cond = pod_condition(get_pod(plane, ns, name) or {}, names.POD_COND_ALLOCATED)
    return None if cond is None else cond.get("status")


def gate_names(pod: dict[str, Any]) -> list[str]:
    return [g.get("name") for g in (pod["spec"].get("schedulingGates") or [])]


def env_by_name(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env") or []}


def samples(text: str, family: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample of one metric family."""
    out = []
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            out += [(s.name, dict(s.labels), float(s.value)) for s in fam.samples]
    return out


def sample_sum(text: str, family: str, sample: str, **labels: str) -> float:
    return sum(
        value
        for name, have, value in samples(text, family)
        if name == sample and all(have.get(k) == v for k, v in labels.items())
    )


def patch_status(plane: LocalPlane, ns: str, name: str, kind: str, patch: Any) -> None:
    plane.kubectl(
        "patch", "pod", name, "-n", ns, "--subresource=status", f"--type={kind}",
        "-p", json.dumps(patch),
    )  # fmt: skip


def visible_devices(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(names.ANN_VISIBLE_DEVICES)


# ---------------------------------------------------------------- 1. admission

REJECTIONS = {
    "malformed-template": (
        {names.ANN_TEMPLATE: "VIR05-1c"},
        [names.ANN_TEMPLATE, '"VIR05-1c" is not a valid template name'],
    ),
    "template-not-offered": (
        {names.ANN_TEMPLATE: "vir99_9c"},
        [
            '"vir99_9c" is not offered by any node; offered:',
            f"910B3: {TEMPLATE}, {BIG_TEMPLATE}",
            "310P3: vir01, vir02",
        ],
    ),
    "count-not-integer": (
        {names.ANN_COUNT: "two"},
        [f'{names.ANN_COUNT} "two" is not a whole number', "integer from 1 to 8"],
    ),
    "count-zero": (
        {names.ANN_COUNT: "0"},
        [f'{names.ANN_COUNT} "0" is out of range', "integer from 1 to 8"],
    ),
    "count-nine": (
        {names.ANN_COUNT: "9"},
        [f'{names.ANN_COUNT} "9" is out of range', "integer from 1 to 8"],
    ),
    "unknown-chip-model": (
        {names.ANN_CHIP_MODEL: "910Z9"},
        [f'{names.ANN_CHIP_MODEL} "910Z9" is not a chip model of this cluster', "known models:"],
    ),
    "container-not-in-pod": (
        {names.ANN_CONTAINERS: "main,ghost"},
        [f'{names.ANN_CONTAINERS} names "ghost", not in this pod', "containers: main"],
    ),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
def test_webhook_rejects_bad_request_with_clear_message(
    stack: Stack, plane: LocalPlane, namespace: str, case: str
) -> None:
    annotations, expected = REJECTIONS[case]
    pod = vnpu_pod("bad", namespace, annotations=annotations)
    why = apply_rejected(plane, pod)
    assert "denied the request" in why, why
    for part in expected:
        assert part in why, f"{part!r} not in rejection: {why}"
    if case == "unknown-chip-model":
        assert "910B3" in why, why
        assert "310P3" in why, why
    assert get_pod(plane, namespace, "bad") is None
    assert stack.operator.ready()


# ---------------------------------------------------------------- 2. mutation


def test_mutation_adds_gate_finalizer_and_env_to_selected_containers(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    nowhere = {"lc-nowhere": "true"}  # no node has it: the pods stay gated
    every = vnpu_pod(
        "every",
        namespace,
        containers=["main", "side"],
        init_containers=["init"],
        node_selector=nowhere,
    )
    picky = vnpu_pod(
        "picky",
        namespace,
        containers=["main", "side"],
        init_containers=["init"],
        node_selector=nowhere,
        annotations={names.ANN_CONTAINERS: "main"},
    )
    plain = vnpu_pod("plain", namespace, template=None, annotations={"example.com/other": "x"})
    for manifest in (every, picky, plain):
        plane.apply(manifest)

    want_visible = {
        "name": names.ENV_VISIBLE_DEVICES,
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": VISIBLE_DEVICES_FIELD_PATH}},
    }
    assert VISIBLE_DEVICES_FIELD_PATH == "metadata.annotations['vnpu.io/visible-devices']"
    want_runtime = {"name": names.ENV_RUNTIME_OPTIONS, "value": names.RUNTIME_OPTIONS_VIRTUAL}

    # The operator has looked at the pods (and left them gated).
    for name in ("every", "picky"):
        wait_for(
            f"{name} told it waits",
            lambda n=name: allocated_status(plane, namespace, n) == "False",
            timeout=60,
        )
    for name in ("every", "picky"):
        pod = get_pod(plane, namespace, name)
        assert pod is not None
        assert gate_names(pod) == [names.SCHEDULING_GATE]
        assert names.POD_FINALIZER in pod["metadata"]["finalizers"]
        assert pod["status"].get("phase") == "Pending"
        assert not pod["spec"].get("nodeName")
        assert visible_devices(pod) is None

    every_pod = get_pod(plane, namespace, "every")
    assert every_pod is not None
    containers = every_pod["spec"]["initContainers"] + every_pod["spec"]["containers"]
    assert [c["name"] for c in containers] == ["init", "main", "side"]
    for c in containers:
        env = env_by_name(c)
        assert env.get(names.ENV_VISIBLE_DEVICES) == want_visible, c
        assert env.get(names.ENV_RUNTIME_OPTIONS) == want_runtime, c

    picky_pod = get_pod(plane, namespace, "picky")
    assert picky_pod is not None
    by_name = {c["name"]: c for c in picky_pod["spec"]["initContainers"]}
    by_name |= {c["name"]: c for c in picky_pod["spec"]["containers"]}
    main_env = env_by_name(by_name["main"])
    assert main_env.get(names.ENV_VISIBLE_DEVICES) == want_visible
    assert main_env.get(names.ENV_RUNTIME_OPTIONS) == want_runtime
    # Left out, the others get an empty device list: their image or an envFrom source
    # could otherwise name any vNPU of the node.
    for excluded in ("init", "side"):
        env = env_by_name(by_name[excluded])
        assert env.get(names.ENV_VISIBLE_DEVICES) == {"name": names.ENV_VISIBLE_DEVICES}, env
        assert env.get(names.ENV_RUNTIME_OPTIONS) == want_runtime
    for c in containers + list(by_name.values()):
        assert env_by_name(c).get(names.ENV_VNPU_SPECS) == {"name": names.ENV_VNPU_SPECS}, c

    # Not asking for vNPUs: untouched, scheduled as usual.
    plain_pod = pod_running(plane, namespace, "plain")
    assert not plain_pod["spec"].get("schedulingGates")
    assert names.POD_FINALIZER not in (plain_pod["metadata"].get("finalizers") or [])
    assert "env" not in plain_pod["spec"]["containers"][0]
    assert names.ANN_VISIBLE_DEVICES not in plain_pod["metadata"]["annotations"]
    assert pod_allocations(plane, namespace, plain_pod["metadata"]["uid"]) == []


# ---------------------------------------------------------------- 3. count


def test_count_three_gets_three_distinct_vnpus_on_one_node(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    # 3 x vir10_3c_32g: two fit on a 910B3 chip, so lc-3 must use both chips.
    pod = vnpu_pod(
        "three",
        namespace,
        template=BIG_TEMPLATE,
        count=3,
        node_selector={"kubernetes.io/hostname": "lc-3"},
    )
    plane.apply(tolerate(pod, "lc-3"))
    p = pod_running(plane, namespace, "three")
    allocs = pod_allocations(plane, namespace, p["metadata"]["uid"])
    assert len(allocs) == 3
    assert {a["spec"]["nodeName"] for a in allocs} == {"lc-3"}
    assert p["spec"]["nodeName"] == "lc-3"
    assert [a["status"]["phase"] for a in allocs] == [names.PHASE_READY] * 3
    ids = [a["spec"]["vnpuId"] for a in allocs]
    assert len(set(ids)) == 3, ids
    assert {a["spec"]["chip"] for a in allocs} == {0, 1}
    for a in allocs:
        assert a["spec"]["template"] == BIG_TEMPLATE
        assert a["status"]["devicePath"] == names.device_path(a["spec"]["vnpuId"])
    devices = visible_devices(p)
    assert devices is not None
    listed = [int(x) for x in devices.split(",")]
    assert sorted(listed) == sorted(ids), devices
    assert vnpu_ids(stack.agent.sim("lc-3")) == dict.fromkeys(ids, BIG_TEMPLATE)


# ---------------------------------------------------------------- 4. waiting


def test_pod_waits_for_a_matching_node_then_runs_when_one_is_labelled(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    pod = vnpu_pod("sel", namespace, node_selector={"lc-zone": "z1"})
    plane.apply(tolerate(pod, "lc-b"))

    def waiting() -> dict[str, Any] | None:
        cond = pod_condition(get_pod(plane, namespace, "sel") or {}, names.POD_COND_ALLOCATED)
        return cond if cond and cond.get("status") == "False" else None

    cond = wait_for("condition Allocated=False", waiting, timeout=60)
    assert cond["reason"] == "WaitingForCapacity"
    assert "node selector" in cond["message"], cond
    event = wait_event(plane, namespace, "sel", "WaitingForCapacity")[0]
    assert "node selector" in event["message"], event
    assert event["source"]["component"] == "vnpu-operator"
    waiting_gauge = "vnpu_operator_pods_waiting"
    assert sample_sum(stack.operator.metrics(), waiting_gauge, waiting_gauge) >= 1
    gated = get_pod(plane, namespace, "sel")
    assert gated is not None
    assert gate_names(gated) == [names.SCHEDULING_GATE]
    assert pod_allocations(plane, namespace, gated["metadata"]["uid"]) == []

    plane.kubectl("label", "node", "lc-b", "lc-zone=z1")
    try:
        # Nothing else changes: the Node update alone must get the pod placed.
        p = pod_running(plane, namespace, "sel")
        assert p["spec"]["nodeName"] == "lc-b"
        assert p["spec"]["nodeSelector"]["lc-zone"] == "z1"
        (alloc,) = pod_allocations(plane, namespace, p["metadata"]["uid"])
        assert alloc["spec"]["nodeName"] == "lc-b"
        assert alloc["status"]["phase"] == names.PHASE_READY
        assert visible_devices(p) == str(alloc["spec"]["vnpuId"])
        # The operator flips the condition right after its pinning patch, so
        # the pod may already run an instant before.
        wait_for(
            "condition Allocated=True",
            lambda: allocated_status(plane, namespace, "sel") == "True",
            timeout=30,
        )
        wait_event(plane, namespace, "sel", "VNPUsReady")
    finally:
        plane.kubectl("label", "node", "lc-b", "lc-zone-", check=False)


# ---------------------------------------------------------------- 5. terminal


def test_terminal_pod_releases_its_vnpus_and_keeps_the_pod_object(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(vnpu_pod("done", namespace))
    p = pod_running(plane, namespace, "done")
    uid = p["metadata"]["uid"]
    (alloc,) = pod_allocations(plane, namespace, uid)
    node, vnpu_id = alloc["spec"]["nodeName"], alloc["spec"]["vnpuId"]
    assert vnpu_id in sim_vnpus(stack.agent.sim(node))

    patch_status(plane, namespace, "done", "merge", {"status": {"phase": "Succeeded"}})

    def finalizer_off() -> bool:
        pod = get_pod(plane, namespace, "done")
        assert pod is not None, "terminal pod was deleted"
        return names.POD_FINALIZER not in (pod["metadata"].get("finalizers") or [])

    wait_for("pod finalizer removed", finalizer_off, timeout=60)
    assert pod_allocations(plane, namespace, uid) == []
    assert vnpu_id not in sim_vnpus(stack.agent.sim(node))
    pod = get_pod(plane, namespace, "done")
    assert pod is not None
    assert pod["metadata"]["uid"] == uid
    assert pod["status"]["phase"] == "Succeeded"
    assert not pod["metadata"].get("deletionTimestamp")
    event = wait_event(plane, namespace, "done", "VNPUsReleased")[0]
    assert event["type"] == "Normal"


# ---------------------------------------------------------------- 6. restart


def test_container_restart_keeps_the_same_vnpu(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(vnpu_pod("restart", namespace))
    p = pod_running(plane, namespace, "restart")
    uid = p["metadata"]["uid"]
    (before,) = pod_allocations(plane, namespace, uid)
    devices = visible_devices(p)
    node, vnpu_id = before["spec"]["nodeName"], before["spec"]["vnpuId"]
    wait_event(plane, namespace, "restart", "VNPUsReady")

    patch_status(
        plane, namespace, "restart", "json",
        [{"op": "replace", "path": "/status/containerStatuses/0/restartCount", "value": 1}],
    )  # fmt: skip
    restarted = get_pod(plane, namespace, "restart")
    assert restarted is not None
    assert restarted["status"]["containerStatuses"][0]["restartCount"] == 1
    # Absence of change needs time to show: several agent resyncs and operator
    # reconciles of the updated pod.
    time.sleep(3)

    after = pod_allocations(plane, namespace, uid)
    assert [a["metadata"]["uid"] for a in after] == [before["metadata"]["uid"]]
    assert after[0]["spec"]["vnpuId"] == vnpu_id
    assert after[0]["status"]["phase"] == names.PHASE_READY
    assert not after[0]["metadata"].get("deletionTimestamp")
    pod = get_pod(plane, namespace, "restart")
    assert pod is not None
    assert visible_devices(pod) == devices == str(vnpu_id)
    assert pod["spec"]["nodeName"] == node
    assert pod["status"]["phase"] == "Running"
    assert vnpu_id in sim_vnpus(stack.agent.sim(node))
    assert len(pod_events(plane, namespace, "restart", "VNPUsReady")) == 1


# ---------------------------------------------------------------- 7. idle vNPU


def test_running_pod_that_never_opens_its_vnpu_keeps_it(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """Premature destroy: an allocated vNPU nobody opened was garbage-collected."""
    plane.apply(vnpu_pod("idle", namespace))
    p = pod_running(plane, namespace, "idle")
    (alloc,) = pod_allocations(plane, namespace, p["metadata"]["uid"])
    node, vnpu_id = alloc["spec"]["nodeName"], alloc["spec"]["vnpuId"]
    gc_before = sample_sum(
        stack.agent.metrics(), "vnpu_agent_gc_actions", "vnpu_agent_gc_actions_total", node=node
    )

    # 10 s = 5 GC grace periods at 0.5 s resync; with the default timing this
    # stands for more than 2 minutes of a pod that never touches its device.
    watch = 5 * GC_GRACE_SECONDS
    deadline = time.monotonic() + watch
    while time.monotonic() < deadline:
        present = sim_vnpus(stack.agent.sim(node))
        assert vnpu_id in present, f"vNPU {vnpu_id} of a running pod was destroyed"
        assert not present[vnpu_id].in_use
        time.sleep(RESYNC_SECONDS / 2)

    (still,) = pod_allocations(plane, namespace, p["metadata"]["uid"])
    assert still["metadata"]["uid"] == alloc["metadata"]["uid"]
    assert still["status"]["phase"] == names.PHASE_READY
    assert not still["metadata"].get("deletionTimestamp")
    assert vnpu_ids(stack.agent.sim(node)).get(vnpu_id) == TEMPLATE
    gc_after = sample_sum(
        stack.agent.metrics(), "vnpu_agent_gc_actions", "vnpu_agent_gc_actions_total", node=node
    )
    assert gc_after == gc_before, "the agent garbage-collected on the pod's node"


# ---------------------------------------------------------------- 8. lost


def test_allocation_deleted_by_hand_destroys_vnpu_and_warns_the_pod(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(vnpu_pod("lost", namespace))
    p = pod_running(plane, namespace, "lost")
    uid = p["metadata"]["uid"]
    (alloc,) = pod_allocations(plane, namespace, uid)
    node, vnpu_id = alloc["spec"]["nodeName"], alloc["spec"]["vnpuId"]
    name = alloc["metadata"]["name"]

    plane.kubectl("delete", names.ALLOCATION_PLURAL, "-n", namespace, name, "--wait=false")

    wait_for("allocation gone", lambda: not pod_allocations(plane, namespace, uid), timeout=60)
    assert vnpu_id not in sim_vnpus(stack.agent.sim(node))
    event = wait_event(plane, namespace, "lost", "VNPUReleasedExternally")[0]
    assert event["type"] == "Warning"
    assert name in event["message"], event
    assert str(vnpu_id) in event["message"], event
    assert stack.operator.ready(), "operator not ready after a hand-deleted allocation"
    pod = get_pod(plane, namespace, "lost")
    assert pod is not None
    assert pod["metadata"]["uid"] == uid
    # The operator does not quietly re-place a started pod.
    assert pod_allocations(plane, namespace, uid) == []


# ---------------------------------------------------------------- 9. metrics


def test_metrics_follow_an_allocation_and_forget_it_when_gone(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    family, hist = "vnpu_operator_allocations", "vnpu_operator_allocation_latency_seconds"
    release = "vnpu_operator_release_latency_seconds"
    before = stack.operator.metrics()
    latency_before = sample_sum(before, hist, f"{hist}_count")
    release_before = sample_sum(before, release, f"{release}_count")
    assert not [s for s in samples(before, family) if s[1].get("node") == "lc-m"]

    pod = vnpu_pod("metered", namespace, node_selector={"kubernetes.io/hostname": "lc-m"})
    plane.apply(tolerate(pod, "lc-m"))
    p = pod_running(plane, namespace, "metered")
    (alloc,) = pod_allocations(plane, namespace, p["metadata"]["uid"])
    assert alloc["spec"]["nodeName"] == "lc-m"

    during = stack.operator.metrics()
    series = [s for s in samples(during, family) if s[1].get("node") == "lc-m"]
    assert series == [
        (family, {"phase": names.PHASE_READY, "template": TEMPLATE, "node": "lc-m"}, 1.0)
    ], series
    assert sample_sum(during, hist, f"{hist}_count") >= latency_before + 1

    plane.kubectl("delete", "pod", "-n", namespace, "metered", "--wait=false")
    wait_for("pod gone", lambda: get_pod(plane, namespace, "metered") is None, timeout=60)
    after = stack.operator.metrics()
    leftover = [s for s in samples(after, family) if s[1].get("node") == "lc-m"]
    assert leftover == [], leftover
    wait_for(
        "release latency observed",
        lambda: (
            sample_sum(stack.operator.metrics(), release, f"{release}_count") >= release_before + 1
        ),
        timeout=10,
    )
    assert vnpu_ids(stack.agent.sim("lc-m")) == {}
