"""The operator when things go wrong, on the real plane: vNPU creation that
fails, agents that stop renewing their Lease, Node objects that vanish, pods
deleted mid-way, bursts competing for the last capacity and an operator
SIGKILLed while it places pods (docs/ARCHITECTURE.md, 'A pod's life' and 'Invariants').

One operator and two agent processes serve every test of this module: the
main agent hosts most nodes; `ch-lease-x` runs on an agent of its own with a
short Lease so that one test can stop it. Each test uses its own nodes,
chosen through the `ch-group` node label (or the hostname label).
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import (
    Stack,
    get_json,
    get_pod,
    pod_allocations,
    pod_events,
    sim_vnpus,
    wait_event,
)

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE, AgentProcess
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_agent.drivers.sim import SimDriver
from vnpu_common.wire import names
from vnpu_common.wire.models import VNPUNodeStatus

pytestmark = pytest.mark.plane

GROUP = "ch-group"
HOSTNAME = "kubernetes.io/hostname"
SMALL = "vir05_1c_16g"  # 5 of 20 AICore, 16 of 64 GB: 4 per 910B3 chip
LARGE = "vir10_3c_32g"  # 10 of 20 AICore, 32 of 64 GB: 2 per 910B3 chip


def _node(name: str, group: str, chips: int = 1) -> NodeSpec:
    return NodeSpec(name=name, chips={"910B3": chips}, labels={GROUP: group})


MAIN_NODES = [
    _node("ch-fail-a", "fail"),
    _node("ch-fail-b", "fail"),
    _node("ch-exhaust-a", "exhaust"),
    _node("ch-exhaust-b", "exhaust"),
    _node("ch-exhaust-c", "exhaust"),
    _node("ch-lease-y", "lease"),
    _node("ch-gone-a", "gone"),
    _node("ch-gone-b", "gone"),
    _node("ch-gated", "gated"),
    _node("ch-slow", "slow"),
    _node("ch-burst-a", "burst"),
    _node("ch-burst-b", "burst"),
    _node("ch-chaos-a", "chaos", chips=2),
    _node("ch-chaos-b", "chaos", chips=2),
]
LEASE_NODE = _node("ch-lease-x", "lease")
LEASE_SECONDS = 5


@dataclass
class Env:
    plane: LocalPlane
    stack: Stack
    lease_agent: AgentProcess

    def sim(self, node: str) -> SimDriver:
        agent = self.lease_agent if node == LEASE_NODE.name else self.stack.agent
        return agent.sim(node)


@pytest.fixture(scope="module")
def env(plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = Path(tmp_path_factory.mktemp("failures"))
    stack = Stack(plane, workdir / "stack", MAIN_NODES, operator_extra=["--lease-grace-seconds=1"])
    plane.add_nodes([LEASE_NODE])
    (workdir / "lease-agent").mkdir()
    lease_agent = AgentProcess(
        plane,
        workdir / "lease-agent",
        [LEASE_NODE.name],
        extra=[f"--lease-duration-seconds={LEASE_SECONDS}"],
    )
    try:
        # The stack first: it clears VNPUNodes of nodes it does not serve.
        stack.start()
        lease_agent.start()
        wait_for(
            "VNPUNode of the lease node",
            lambda: get_json(plane, "vnpunode", LEASE_NODE.name),
            timeout=30,
        )
        yield Env(plane, stack, lease_agent)
    finally:
        try:
            if lease_agent.proc is None:
                # Its node's pods can only be released while it runs.
                with contextlib.suppress(Exception):
                    lease_agent.start()
            stack.close()
        finally:
            lease_agent.kill(signal.SIGTERM)
            node = LEASE_NODE.name
            plane.kubectl("delete", "node", node, "--wait=false", check=False)
            plane.kubectl("delete", "vnpunode", node, "--wait=false", check=False)
            plane.kubectl(
                "delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(node),
                "--wait=false", check=False,
            )  # fmt: skip


# ---------------------------------------------------------------- helpers


def in_group(group: str, node: str | None = None) -> dict[str, str]:
    """A node selector for the nodes of one test's group, or one node of it."""
    selector = {GROUP: group}
    if node is not None:
        selector[HOSTNAME] = node
    return selector


def create_pod(plane: LocalPlane, pod: dict[str, Any]) -> None:
    plane.kubectl("create", "-f", "-", input=yaml.safe_dump(pod))


def list_pods(plane: LocalPlane, namespace: str) -> list[dict[str, Any]]:
    return list((get_json(plane, "pods", "-n", namespace) or {}).get("items", []))


def allocations(plane: LocalPlane, *selector: str) -> list[dict[str, Any]]:
    """Allocations in the whole cluster, optionally narrowed (`-n ns`, `-l ...`)."""
    args = selector or ("-A",)
    return list((get_json(plane, "vnpuallocations", *args) or {}).get("items", []))


def allocations_on(plane: LocalPlane, node: str) -> list[dict[str, Any]]:
    return allocations(plane, "-A", "-l", f"{names.LABEL_NODE}={node}")


def is_running(pod: dict[str, Any] | None) -> bool:
    return bool(pod) and (pod or {}).get("status", {}).get("phase") == "Running"


def is_gated(pod: dict[str, Any]) -> bool:
    gates = pod.get("spec", {}).get("schedulingGates") or []
    return any(g.get("name") == names.SCHEDULING_GATE for g in gates)


def allocated_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == names.POD_COND_ALLOCATED:
            return dict(cond)
    return None


def waiting_for_capacity(pod: dict[str, Any]) -> bool:
    """Gated, unscheduled, and saying why: condition Allocated=False, WaitingForCapacity."""
    cond = allocated_condition(pod) or {}
    return (
        is_gated(pod)
        and not pod.get("spec", {}).get("nodeName")
        and cond.get("status") == "False"
        and cond.get("reason") == "WaitingForCapacity"
    )


def wait_running(
    plane: LocalPlane, namespace: str, name: str, timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = get_pod(plane, namespace, name)
        return pod if is_running(pod) else None

    pod: dict[str, Any] = wait_for(f"pod {name} Running", check, timeout=timeout, interval=0.5)
    return pod


def wait_condition(
    plane: LocalPlane, namespace: str, name: str, reason: str, timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = get_pod(plane, namespace, name)
        cond = allocated_condition(pod or {}) or {}
        ok = cond.get("status") == "False" and cond.get("reason") == reason
        return pod if ok else None

    pod: dict[str, Any] = wait_for(
        f"pod {name}: condition {names.POD_COND_ALLOCATED}=False {reason}",
        check,
        timeout=timeout,
        interval=0.5,
    )
    return pod


def delete_pods_and_wait(plane: LocalPlane, namespace: str, timeout: float = 60) -> None:
    """Deletes every pod of the namespace; they go only once their vNPUs are destroyed."""
    plane.kubectl("delete", "pods", "-n", namespace, "--all", "--wait=false")
    wait_for(
        f"pods of {namespace} gone",
        lambda: not list_pods(plane, namespace),
        timeout=timeout,
        interval=0.5,
    )


def held(sim: SimDriver) -> dict[int, tuple[int, str]]:
    """vNPU id -> (chip, template), as the simulated driver holds them: what an
    allocation's spec declares."""
    return {i: (v.chip, v.template) for i, v in sim_vnpus(sim).items()}


def destroys(agent: AgentProcess, node: str) -> float:
    """Successful driver destroys on `node`, from the agent's metrics."""
    want = ("vnpu_agent_driver_operations_total{", f'node="{node}"', 'op="destroy"', 'result="ok"')
    for line in agent.metrics().splitlines():
        if line.startswith(want[0]) and all(w in line for w in want[1:]):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def spec_of(alloc: dict[str, Any]) -> dict[str, Any]:
    return dict(alloc["spec"])


def assert_no_double_booking(plane: LocalPlane, nodes: list[str]) -> list[dict[str, Any]]:
    """No (node, vNPU id) held twice, every id in its chip's range, and no chip
    booked past its AICore, memory, AICPU or media; returns the allocations."""
    allocs = [a for a in allocations(plane) if spec_of(a)["nodeName"] in nodes]
    held = [(spec_of(a)["nodeName"], spec_of(a)["vnpuId"]) for a in allocs]
    dupes = sorted({k for k in held if held.count(k) > 1})
    assert not dupes, f"vNPU ids held by two allocations: {dupes}"
    for node in nodes:
        status = (get_json(plane, "vnpunode", node) or {}).get("status") or {}
        chips = status.get("chips") or []
        assert chips, f"VNPUNode {node} lists no chips"
        parsed = VNPUNodeStatus.model_validate(status)
        for chip in chips:
            offered = {
                t.name: t.model_dump(by_alias=True)
                for c in parsed.chips
                if c.index == chip["index"]
                for t in parsed.chip_templates(c)
            }
            mine = [
                spec_of(a)
                for a in allocs
                if spec_of(a)["nodeName"] == node and spec_of(a)["chip"] == chip["index"]
            ]
            for spec in mine:
                assert chip["vnpuIdMin"] <= spec["vnpuId"] <= chip["vnpuIdMax"], (node, spec)
            for res, total in (
                ("aicore", "aicoreTotal"),
                ("memoryMb", "memoryTotalMb"),
                ("aicpu", "aicpuTotal"),
                ("media", "mediaTotal"),
            ):
                used = sum(offered[s["template"]][res] for s in mine)
                assert used <= chip[total], (
                    f"{node} chip {chip['index']} oversubscribed: {res} {used} > {chip[total]} "
                    f"({[s['template'] for s in mine]})"
                )
    return allocs


# ---------------------------------------------------------------- tests


def test_failed_creation_is_placed_elsewhere(env: Env, plane: LocalPlane, namespace: str) -> None:
    fail_then_place_elsewhere(env, plane, namespace, midway=False)


def fail_then_place_elsewhere(env: Env, plane: LocalPlane, namespace: str, *, midway: bool) -> None:
    """Both nodes are empty and alike: binpack breaks the tie by name, so
    ch-fail-a is tried first, and every create there fails. Midway: the
    driver makes the vNPU, then reports failure; it must not stay behind.
    A few rounds, since what follows a failure is a race between agent and
    operator."""
    failing, other = env.sim("ch-fail-a"), env.sim("ch-fail-b")
    failing.inject_failure("create", after=midway, message="injected: chip firmware says no")
    try:
        for round_ in range(3):
            name = f"p{round_}"
            destroyed_before = destroys(env.stack.agent, "ch-fail-a")
            create_pod(
                plane, vnpu_pod(name, namespace, template=SMALL, node_selector=in_group("fail"))
            )
            pod = wait_running(plane, namespace, name)
            allocs = pod_allocations(plane, namespace, pod["metadata"]["uid"])
            assert pod["spec"]["nodeName"] == "ch-fail-b", (
                f"round {round_}: pod started on {pod['spec']['nodeName']} with visible devices "
                f"{pod['metadata']['annotations'].get(names.ANN_VISIBLE_DEVICES)}; allocations: "
                f"{[(a['spec']['nodeName'], a.get('status', {}).get('phase')) for a in allocs]}, "
                f"vNPUs on ch-fail-a: {sim_vnpus(failing)}"
            )

            failed = wait_event(plane, namespace, name, "AllocationFailed")
            assert all(e["type"] == "Warning" for e in failed), failed
            assert any("ch-fail-a" in e["message"] for e in failed), failed

            (alloc,) = allocs
            assert alloc["spec"]["nodeName"] == "ch-fail-b"
            assert alloc["status"]["phase"] == names.PHASE_READY
            # The allocation still guards its vNPU: released only through the agent.
            assert names.ALLOCATION_FINALIZER in alloc["metadata"].get("finalizers", []), (
                f"round {round_}: allocation on ch-fail-b lost its finalizer: {alloc['metadata']}"
            )
            vnpu_id = alloc["spec"]["vnpuId"]
            assert pod["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] == str(vnpu_id)
            assert held(other) == {vnpu_id: (alloc["spec"]["chip"], SMALL)}
            assert sim_vnpus(failing) == {}, f"round {round_}: vNPU left on ch-fail-a"
            assert allocations_on(plane, "ch-fail-a") == []
            # The half-made vNPU was destroyed (and nothing was, when none was made).
            assert destroys(env.stack.agent, "ch-fail-a") - destroyed_before == int(midway)

            # Released like any other: pod gone only once its vNPU is.
            plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
            wait_for(
                f"pod {name} gone",
                lambda: get_pod(plane, namespace, name) is None,  # noqa: B023
                timeout=60,
                interval=0.3,
            )
            assert sim_vnpus(other) == {}, f"round {round_}: pod gone, its vNPU still there"
            assert allocations(plane, "-n", namespace) == []
    finally:
        failing.clear_faults()


def test_attempts_exhausted_leaves_pod_gated(env: Env, plane: LocalPlane, namespace: str) -> None:
    nodes = ["ch-exhaust-a", "ch-exhaust-b", "ch-exhaust-c"]  # as many as --max-attempts (3)
    for node in nodes:
        env.sim(node).inject_failure("create")
    try:
        create_pod(
            plane, vnpu_pod("p", namespace, template=SMALL, node_selector=in_group("exhaust"))
        )
        pod = wait_condition(plane, namespace, "p", "AllocationFailed")
        assert is_gated(pod)
        assert not pod["spec"].get("nodeName")
        assert "3 failed" in (allocated_condition(pod) or {}).get("message", "")

        failed = [
            e
            for e in pod_events(plane, namespace, "p", "AllocationFailed")
            if e["message"].startswith("vNPU on node")
        ]
        failed_nodes = sorted(n for n in nodes for e in failed if f"node {n} " in e["message"])
        assert failed_nodes == nodes, [e["message"] for e in failed]

        # It stays so: nothing is placed again (time passing is the point).
        time.sleep(3)
        pod = get_pod(plane, namespace, "p") or {}
        assert is_gated(pod)
        assert not pod["spec"].get("nodeName")
        assert (allocated_condition(pod) or {}).get("reason") == "AllocationFailed"
        assert pod_allocations(plane, namespace, pod["metadata"]["uid"]) == []
        for node in nodes:
            assert allocations_on(plane, node) == [], node
            assert sim_vnpus(env.sim(node)) == {}, node
    finally:
        for node in nodes:
            env.sim(node).clear_faults()

    delete_pods_and_wait(plane, namespace)
    assert allocations(plane, "-n", namespace) == []


def test_expired_agent_lease(env: Env, plane: LocalPlane, namespace: str) -> None:
    x, y = LEASE_NODE.name, "ch-lease-y"
    create_pod(
        plane, vnpu_pod("old", namespace, template=SMALL, node_selector=in_group("lease", x))
    )
    old = wait_running(plane, namespace, "old")
    assert old["spec"]["nodeName"] == x
    (old_alloc,) = pod_allocations(plane, namespace, old["metadata"]["uid"])
    old_id = old_alloc["spec"]["vnpuId"]

    env.lease_agent.kill(signal.SIGKILL)
    try:
        lost = wait_event(plane, namespace, "old", "NodeNotLive", timeout=LEASE_SECONDS + 30)
        assert any(x in e["message"] for e in lost), lost
        assert all(e["type"] == "Warning" for e in lost), lost

        # Kept: the allocation, its vNPU and the pod.
        (still,) = pod_allocations(plane, namespace, old["metadata"]["uid"])
        assert not still["metadata"].get("deletionTimestamp")
        assert still["spec"]["vnpuId"] == old_id
        assert held(env.sim(x)) == {old_id: (old_alloc["spec"]["chip"], SMALL)}
        assert is_running(get_pod(plane, namespace, "old"))

        # A new pod that may go to either node goes to y, although binpack
        # would prefer x (it already holds a vNPU).
        create_pod(
            plane, vnpu_pod("anywhere", namespace, template=SMALL, node_selector=in_group("lease"))
        )
        anywhere = wait_running(plane, namespace, "anywhere")
        assert anywhere["spec"]["nodeName"] == y

        # A pod that may only go to x waits, saying the agent is not live.
        create_pod(
            plane, vnpu_pod("only-x", namespace, template=SMALL, node_selector=in_group("lease", x))
        )
        only_x = wait_condition(plane, namespace, "only-x", "WaitingForCapacity")
        assert is_gated(only_x)
        assert "agent not live" in (allocated_condition(only_x) or {}).get("message", "")
        assert pod_allocations(plane, namespace, only_x["metadata"]["uid"]) == []
        assert [a["spec"]["vnpuId"] for a in allocations_on(plane, x)] == [old_id]
    finally:
        env.lease_agent.start()

    # Live again: the waiting pod is placed there, the old vNPU untouched.
    only_x = wait_running(plane, namespace, "only-x")
    assert only_x["spec"]["nodeName"] == x
    (new_alloc,) = pod_allocations(plane, namespace, only_x["metadata"]["uid"])
    assert new_alloc["spec"]["nodeName"] == x
    assert set(sim_vnpus(env.sim(x))) == {old_id, new_alloc["spec"]["vnpuId"]}
    assert is_running(get_pod(plane, namespace, "old"))

    delete_pods_and_wait(plane, namespace)
    assert sim_vnpus(env.sim(x)) == {}
    assert sim_vnpus(env.sim(y)) == {}
    assert allocations(plane, "-n", namespace) == []


def test_deleted_node_takes_no_new_pods(env: Env, plane: LocalPlane, namespace: str) -> None:
    gone, other = "ch-gone-a", "ch-gone-b"
    plane.kubectl("delete", "node", gone, "--wait=false")
    wait_for(f"node {gone} gone", lambda: get_json(plane, "node", gone) is None, timeout=30)

    # Either node may take it; the tie would go to ch-gone-a by name.
    create_pod(
        plane, vnpu_pod("anywhere", namespace, template=SMALL, node_selector=in_group("gone"))
    )
    anywhere = wait_running(plane, namespace, "anywhere")
    assert anywhere["spec"]["nodeName"] == other

    # Only the deleted node may take it: it waits.
    create_pod(
        plane,
        vnpu_pod("only-gone", namespace, template=SMALL, node_selector=in_group("gone", gone)),
    )
    only = wait_condition(plane, namespace, "only-gone", "WaitingForCapacity")
    assert is_gated(only)
    assert not only["spec"].get("nodeName")
    assert pod_allocations(plane, namespace, only["metadata"]["uid"]) == []
    assert allocations_on(plane, gone) == []
    assert sim_vnpus(env.sim(gone)) == {}

    delete_pods_and_wait(plane, namespace)
    assert sim_vnpus(env.sim(other)) == {}
    assert allocations(plane, "-n", namespace) == []


def test_pod_deleted_while_gated(env: Env, plane: LocalPlane, namespace: str) -> None:
    node = "ch-gated"
    create_pod(
        plane,
        vnpu_pod("filler", namespace, template=LARGE, count=2, node_selector=in_group("gated")),
    )
    filler = wait_running(plane, namespace, "filler")
    filler_ids = {
        a["spec"]["vnpuId"] for a in pod_allocations(plane, namespace, filler["metadata"]["uid"])
    }
    assert len(filler_ids) == 2

    create_pod(
        plane, vnpu_pod("waiter", namespace, template=SMALL, node_selector=in_group("gated"))
    )
    waiter = wait_condition(plane, namespace, "waiter", "WaitingForCapacity")
    assert waiting_for_capacity(waiter)
    assert names.POD_FINALIZER in waiter["metadata"].get("finalizers", [])
    wait_event(plane, namespace, "waiter", "WaitingForCapacity")

    plane.kubectl("delete", "pod", "-n", namespace, "waiter", "--wait=false")
    wait_for(
        "gated pod gone",
        lambda: get_pod(plane, namespace, "waiter") is None,
        timeout=30,
        interval=0.5,
    )
    assert pod_allocations(plane, namespace, waiter["metadata"]["uid"]) == []
    assert set(sim_vnpus(env.sim(node))) == filler_ids
    assert {a["spec"]["vnpuId"] for a in allocations_on(plane, node)} == filler_ids
    assert is_running(get_pod(plane, namespace, "filler"))

    delete_pods_and_wait(plane, namespace)
    assert sim_vnpus(env.sim(node)) == {}
    assert allocations_on(plane, node) == []


def test_pod_deleted_while_vnpu_is_created(env: Env, plane: LocalPlane, namespace: str) -> None:
    node = "ch-slow"
    sim = env.sim(node)
    sim.inject_slow("create", 4)
    try:
        create_pod(plane, vnpu_pod("p", namespace, template=SMALL, node_selector=in_group("slow")))

        def placed() -> dict[str, Any] | None:
            pod = get_pod(plane, namespace, "p")
            return (
                pod if pod and pod_allocations(plane, namespace, pod["metadata"]["uid"]) else None
            )

        pod = wait_for("pod placed", placed, timeout=30, interval=0.3)
        uid = pod["metadata"]["uid"]
        # The agent is inside the 4 s create now (time passing is the point).
        time.sleep(1)
        (alloc,) = pod_allocations(plane, namespace, uid)
        assert alloc.get("status", {}).get("phase") != names.PHASE_READY
        assert is_gated(get_pod(plane, namespace, "p") or {})

        plane.kubectl("delete", "pod", "-n", namespace, "p", "--wait=false")
        wait_for(
            "pod gone",
            lambda: get_pod(plane, namespace, "p") is None,
            timeout=60,
            interval=0.5,
        )
        assert sim_vnpus(sim) == {}
        assert pod_allocations(plane, namespace, uid) == []
        assert allocations_on(plane, node) == []
        # Nothing comes back once the slow create is long over.
        time.sleep(2)
        assert sim_vnpus(sim) == {}
    finally:
        sim.clear_faults()


def test_burst_for_the_last_capacity(env: Env, plane: LocalPlane, namespace: str) -> None:
    nodes = ["ch-burst-a", "ch-burst-b"]
    slots, n = 4, 7  # two chips, two vir10_3c_32g each
    pods = [
        vnpu_pod(f"b{i}", namespace, template=LARGE, node_selector=in_group("burst"))
        for i in range(n)
    ]
    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(lambda p: create_pod(plane, p), pods))

    def settled(expect_running: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        items = list_pods(plane, namespace)
        running = [p for p in items if is_running(p)]
        waiting = [p for p in items if waiting_for_capacity(p)]
        if len(running) == expect_running and len(running) + len(waiting) == len(items):
            return running, waiting
        return None

    running, waiting = wait_for(
        f"{slots} pods Running, the rest waiting", lambda: settled(slots), timeout=90, interval=0.5
    )
    assert len(waiting) == n - slots
    allocs = assert_no_double_booking(plane, nodes)
    by_pod = {spec_of(a)["podUID"] for a in allocs if spec_of(a)["nodeName"] in nodes}
    assert by_pod == {p["metadata"]["uid"] for p in running}
    assert len(allocs) == slots
    for p in waiting:
        assert pod_events(plane, namespace, p["metadata"]["name"], "WaitingForCapacity")

    victim = running[0]["metadata"]["name"]
    waiting_names = {p["metadata"]["name"] for p in waiting}
    plane.kubectl("delete", "pod", "-n", namespace, victim, "--wait=false")
    start = time.monotonic()

    def one_more() -> list[str] | None:
        started = [
            p["metadata"]["name"]
            for p in list_pods(plane, namespace)
            if p["metadata"]["name"] in waiting_names and is_running(p)
        ]
        return started or None

    started = wait_for("a waiting pod Running", one_more, timeout=20, interval=0.3)
    took = time.monotonic() - start
    assert len(started) == 1, started
    print(f"waiting pod {started[0]} Running {took:.1f}s after {victim} was deleted")

    running, waiting = wait_for("settled again", lambda: settled(slots), timeout=30, interval=0.5)
    assert victim not in {p["metadata"]["name"] for p in running}
    assert len(waiting) == n - slots - 1
    assert len(assert_no_double_booking(plane, nodes)) == slots

    delete_pods_and_wait(plane, namespace)
    for node in nodes:
        assert sim_vnpus(env.sim(node)) == {}, node
    assert allocations(plane, "-n", namespace) == []


def test_operator_sigkilled_during_burst(env: Env, plane: LocalPlane, namespace: str) -> None:
    nodes = ["ch-chaos-a", "ch-chaos-b"]
    slots, n = 16, 20  # two nodes x two chips x four vir05_1c_16g
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"chaos seed {seed}")
    operator = env.stack.operator
    # Creates take a little while, so kills also land between placement and Ready.
    for node in nodes:
        env.sim(node).inject_slow("create", 0.15)

    errors: list[str] = []

    def create_until_admitted(batch: list[dict[str, Any]]) -> None:
        # The webhook is down while the operator is: creation is refused then.
        for pod in batch:
            deadline = time.monotonic() + 120
            text = yaml.safe_dump(pod)
            while True:
                r = plane.kubectl("create", "-f", "-", input=text, check=False)
                if r.returncode == 0 or "AlreadyExists" in r.stderr:
                    break
                if time.monotonic() > deadline:
                    errors.append(f"{pod['metadata']['name']}: {r.stderr.strip()}")
                    return
                time.sleep(0.2)
            time.sleep(0.2)

    pods = [
        vnpu_pod(f"c{i:02d}", namespace, template=SMALL, node_selector=in_group("chaos"))
        for i in range(n)
    ]
    creators = [
        threading.Thread(target=create_until_admitted, args=(pods[k::2],)) for k in range(2)
    ]
    try:
        for t in creators:
            t.start()
        for _ in range(4):
            time.sleep(rng.uniform(0, 1.5))
            operator.kill(signal.SIGKILL)
            operator.start()
        for t in creators:
            t.join(timeout=150)
    finally:
        for node in nodes:
            env.sim(node).clear_faults()
    assert not errors, errors

    def settled() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        items = list_pods(plane, namespace)
        running = [p for p in items if is_running(p)]
        waiting = [p for p in items if waiting_for_capacity(p)]
        if len(items) == n and len(running) + len(waiting) == n and len(running) == slots:
            return running, waiting
        return None

    try:
        running, _ = wait_for(
            f"{slots} pods Running, {n - slots} waiting", settled, timeout=120, interval=1
        )
    except AssertionError:
        summary = [
            (
                p["metadata"]["name"],
                p["status"].get("phase"),
                is_gated(p),
                (allocated_condition(p) or {}).get("reason"),
            )
            for p in list_pods(plane, namespace)
        ]
        raise AssertionError(f"pods did not settle: {summary}\n{operator.log_tail()}") from None

    allocs = assert_no_double_booking(plane, nodes)
    assert len(allocs) == slots
    assert all(a.get("status", {}).get("phase") == names.PHASE_READY for a in allocs)
    running_uids = {p["metadata"]["uid"]: p for p in running}
    assert {spec_of(a)["podUID"] for a in allocs} == set(running_uids)
    for a in allocs:
        pod = running_uids[spec_of(a)["podUID"]]
        assert pod["spec"]["nodeName"] == spec_of(a)["nodeName"]
        devices = pod["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES]
        assert devices == str(spec_of(a)["vnpuId"])

    # Declared == present: every allocation's vNPU exists, and no other.
    for node in nodes:
        declared = {
            spec_of(a)["vnpuId"]: (spec_of(a)["chip"], spec_of(a)["template"])
            for a in allocs
            if spec_of(a)["nodeName"] == node
        }
        assert held(env.sim(node)) == declared, node

    # Release everything, with one more crash in the middle of it.
    plane.kubectl("delete", "pods", "-n", namespace, "--all", "--wait=false")
    time.sleep(rng.uniform(0, 1.0))
    operator.kill(signal.SIGKILL)
    operator.start()
    wait_for(
        "all pods gone",
        lambda: not list_pods(plane, namespace),
        timeout=90,
        interval=0.5,
    )
    for node in nodes:
        assert sim_vnpus(env.sim(node)) == {}, node
    assert allocations(plane, "-n", namespace) == []


def test_failed_midway_creation_is_placed_elsewhere(
    env: Env, plane: LocalPlane, namespace: str
) -> None:
    """Last in the file: a create that fails after making the vNPU (the
    driver reports an error, the device exists) is the same story as
    test_failed_creation_is_placed_elsewhere, and the half-made vNPU goes."""
    fail_then_place_elsewhere(env, plane, namespace, midway=True)
