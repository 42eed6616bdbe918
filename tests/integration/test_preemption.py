"""Priority and preemption on the real plane, with the real agent, operator,
scheduler and disruption controller: one node of one 910B3 chip (four vNPUs
of TEMPLATE), filled by pods of low priority.

A pod of higher priority evicts exactly the one pod it needs, through the
Eviction API; the freed capacity is claimed for it (status.nominatedNodeName)
so that a third pod created meanwhile waits; it is placed there. A
PodDisruptionBudget, `preemptionPolicy: Never`, equal priority and the
default (preemption off) evict nobody. An operator restarted between the
eviction and the placement keeps the claim.

The agent is stopped while a preemptor waits for its victims where a test
must see that wait: without it, the victims' vNPUs go in well under a
second. Its Lease (40 s) keeps the node live meanwhile."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from chart_harness import template
from operator_harness import Stack, StackOf, get_json, pod_allocations, pod_running, pod_waiting

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names
from vnpu_operator.config import OperatorSettings

# k8s134: also run on the 1.34 lane (`make test-k8s134`), since it depends on the API
# server's or the scheduler's version.
pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

NODE, LABEL = "preempt-a", "preempt-test"
TEMPLATE = "vir05_1c_16g"  # four fill the node's one 910B3 chip
SUFFIX = f"{os.getpid()}"
LOW, HIGH, NEVER = f"vnpu-low-{SUFFIX}", f"vnpu-high-{SUFFIX}", f"vnpu-never-{SUFFIX}"
CLASSES = {LOW: (100, None), HIGH: (1000, None), NEVER: (1000, "Never")}
ON = ["--preemption=true"]


@pytest.fixture(scope="module")
def stack(plane: LocalPlane, stack_of: StackOf) -> Iterator[Stack]:
    for name, (value, policy) in CLASSES.items():
        body: dict[str, Any] = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        if policy:
            body["preemptionPolicy"] = policy
        plane.apply(body)
    try:
        yield stack_of(
            [NodeSpec(name=NODE, chips={"910B3": 1}, labels={LABEL: NODE})],
            operator_extra=list(ON),
        )
    finally:
        for name in CLASSES:
            plane.kubectl("delete", "priorityclass", name, check=False)


def pod(namespace: str, name: str, cls: str, **labels: str) -> dict[str, Any]:
    return vnpu_pod(
        name, namespace, template=TEMPLATE, node_selector={LABEL: NODE}, labels=labels,
        spec={"priorityClassName": cls},
    )  # fmt: skip


def create(plane: LocalPlane, manifest: dict[str, Any]) -> None:
    plane.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest))


def fill(plane: LocalPlane, namespace: str, *, finalizers: tuple[str, ...] = ()) -> dict[str, str]:
    """Four running pods of low priority: name -> uid. `finalizers`: created
    with these (the webhook adds ours after them)."""
    for i in range(4):
        manifest = pod(namespace, f"low{i}", LOW, app="low")
        if finalizers:
            manifest["metadata"]["finalizers"] = list(finalizers)
        create(plane, manifest)
    return {
        f"low{i}": pod_running(plane, namespace, f"low{i}")["metadata"]["uid"] for i in range(4)
    }


def pods(plane: LocalPlane, namespace: str) -> dict[str, dict[str, Any]]:
    items = (get_json(plane, "pods", "-n", namespace) or {}).get("items", [])
    return {p["metadata"]["name"]: p for p in items}


def untouched(plane: LocalPlane, namespace: str, lows: dict[str, str]) -> list[str]:
    """The low pods still there, same uid, not terminating."""
    now = pods(plane, namespace)
    return sorted(
        n
        for n, uid in lows.items()
        if n in now
        and now[n]["metadata"]["uid"] == uid
        and not now[n]["metadata"].get("deletionTimestamp")
    )


def events(plane: LocalPlane, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = (get_json(plane, "events", "-n", namespace) or {}).get("items", [])
    return [e for e in items if e.get("reason") == reason]


def nominated(plane: LocalPlane, namespace: str, name: str) -> str:
    p = get_json(plane, "pod", "-n", namespace, name) or {}
    return str((p.get("status") or {}).get("nominatedNodeName") or "")


def reason_of(plane: LocalPlane, namespace: str, name: str, reason: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = pod_waiting(plane, namespace, name)
        return cond if cond.get("reason") == reason else None

    found: dict[str, Any] = wait_for(f"{name} waits with {reason}", check, timeout=60)
    return found


def held_ids(plane: LocalPlane, namespace: str) -> list[int]:
    """vNPU ids of every live allocation in the namespace (no id twice, at
    most four: one chip)."""
    items = (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items", [])
    return sorted(
        int(a["spec"]["vnpuId"]) for a in items if not a["metadata"].get("deletionTimestamp")
    )


def still_waits(
    plane: LocalPlane, namespace: str, name: str, seconds: float = 3.0, *, may_hold: bool = False
) -> None:
    """Gated and holding nothing for `seconds` (the operator has had every
    chance to place it: each capacity change retries waiting pods at once);
    `may_hold`: gated, whatever vNPUs it holds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        p = get_json(plane, "pod", "-n", namespace, name)
        assert p["spec"].get("schedulingGates"), f"{name} was ungated"
        if not may_hold:
            assert pod_allocations(plane, namespace, p["metadata"]["uid"]) == [], f"{name} placed"
        time.sleep(0.3)


def cleanup(plane: LocalPlane, namespace: str) -> None:
    plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=120)


def restart_operator(stack: Stack, extra: list[str]) -> None:
    stack.operator.kill()
    stack.operator.extra = extra
    stack.operator.start()


# ------------------------------------------------------------------ tests


def test_a_higher_priority_pod_evicts_exactly_what_it_needs_and_its_room_is_held(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    lows = fill(plane, namespace)
    stack.agent.kill()  # the victim's vNPU stays until the agent is back
    try:
        create(plane, pod(namespace, "high", HIGH))
        wait_for("one pod evicted", lambda: len(untouched(plane, namespace, lows)) == 3,
                 timeout=30)  # fmt: skip
        (victim,) = set(lows) - set(untouched(plane, namespace, lows))
        assert nominated(plane, namespace, "high") == NODE
        cond = reason_of(plane, namespace, "high", names.REASON_PREEMPTING)
        assert (
            f"waiting on node {NODE} for preempted pod(s) {namespace}/{victim}" in (cond["message"])
        )
        # A third pod of low priority, right after the eviction: it waits.
        create(plane, pod(namespace, "third", LOW))
        cond = reason_of(plane, namespace, "third", names.REASON_WAITING)
        assert "capacity held for a preempting pod" in cond["message"], cond
        still_waits(plane, namespace, "third")
    finally:
        stack.agent.start()
    placed = pod_running(plane, namespace, "high")
    assert placed["spec"]["nodeName"] == NODE
    wait_for("claim cleared", lambda: nominated(plane, namespace, "high") == "", timeout=30)
    # Exactly one victim, ever; the third still waits (the node is full again).
    assert len(untouched(plane, namespace, lows)) == 3
    still_waits(plane, namespace, "third")
    assert len(held_ids(plane, namespace)) == len(set(held_ids(plane, namespace))) == 4
    # Who was told what.
    (told,) = events(plane, namespace, names.REASON_PREEMPTED)
    assert told["involvedObject"]["name"] == victim
    assert f"preempted by {namespace}/high (priority 1000)" in told["message"]
    assert f"node {NODE}" in told["message"]
    (preempting,) = events(plane, namespace, names.REASON_PREEMPTING)
    assert preempting["involvedObject"]["name"] == "high"
    assert (
        f"preempted {namespace}/{victim} (priority below 1000) on node {NODE}"
        in (preempting["message"])
    )
    metrics = stack.operator.metrics()
    assert 'vnpu_operator_preemption_attempts_total{result="evicted"} 1.0' in metrics
    assert "vnpu_operator_preemption_victims_total 1.0" in metrics
    cleanup(plane, namespace)


HOLD = "test.vnpu.io/hold"  # a finalizer of someone else's: the pod object outlives its vNPUs


def unhold(plane: LocalPlane, namespace: str, name: str) -> None:
    plane.kubectl(
        "patch", "pod", "-n", namespace, name, "--type=json",
        "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers/0"}]), check=False,
    )  # fmt: skip


def test_a_preemptor_stays_gated_while_its_victims_object_is_still_counted(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """kube-scheduler counts a pod's vNPU requests on its node until the pod
    object is gone or terminal, not until its vNPUs are. A victim whose object
    outlives its vNPUs (here another finalizer holds it; in life a slow
    kubelet or a slow finalizer write) keeps the preemptor gated, its vNPU
    ready: ungated, it would find the node full, and kube-scheduler would
    run a preemption of its own, evicting a second pod and writing a
    nominatedNodeName that outlives the binding (Kubernetes 1.34)."""
    lows = fill(plane, namespace, finalizers=(HOLD,))
    try:
        create(plane, pod(namespace, "high", HIGH))
        wait_for("one pod evicted", lambda: len(untouched(plane, namespace, lows)) == 3,
                 timeout=30)  # fmt: skip
        (victim,) = set(lows) - set(untouched(plane, namespace, lows))

        def released() -> bool:
            p = get_json(plane, "pod", "-n", namespace, victim) or {}
            return (p.get("metadata") or {}).get("finalizers") == [HOLD]

        wait_for(f"{victim} released (only the hold left)", released, timeout=30)
        still_waits(plane, namespace, "high", may_hold=True)
        cond = reason_of(plane, namespace, "high", names.REASON_WAITING_FOR_LEAVING)
        assert f"{namespace}/{victim}" in cond["message"], cond
        assert len(untouched(plane, namespace, lows)) == 3
    finally:
        for name in lows:
            unhold(plane, namespace, name)
    placed = pod_running(plane, namespace, "high")
    assert placed["spec"]["nodeName"] == NODE
    wait_for("claim cleared", lambda: nominated(plane, namespace, "high") == "", timeout=30)
    assert len(untouched(plane, namespace, lows)) == 3
    told = [e["involvedObject"]["name"] for e in events(plane, namespace, names.REASON_PREEMPTED)]
    assert told == [victim], told
    cleanup(plane, namespace)


def test_preemption_policy_never_waits_without_evicting(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    lows = fill(plane, namespace)
    create(plane, pod(namespace, "polite", NEVER))
    reason_of(plane, namespace, "polite", names.REASON_WAITING)
    still_waits(plane, namespace, "polite")
    assert untouched(plane, namespace, lows) == sorted(lows)
    assert nominated(plane, namespace, "polite") == ""
    cleanup(plane, namespace)


def test_equal_priority_never_preempts(stack: Stack, plane: LocalPlane, namespace: str) -> None:
    lows = fill(plane, namespace)
    create(plane, pod(namespace, "peer", LOW))
    reason_of(plane, namespace, "peer", names.REASON_WAITING)
    still_waits(plane, namespace, "peer")
    assert untouched(plane, namespace, lows) == sorted(lows)
    cleanup(plane, namespace)


def test_a_disruption_budget_is_respected_then_preemption_retries(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    lows = fill(plane, namespace)
    plane.apply(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep-all", "namespace": namespace},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "low"}}},
        }
    )

    def counted() -> bool:
        status = (get_json(plane, "pdb", "-n", namespace, "keep-all") or {}).get("status") or {}
        return status.get("currentHealthy") == 4 and status.get("disruptionsAllowed") == 0

    wait_for("budget counted", counted, timeout=60, interval=0.5)
    create(plane, pod(namespace, "high", HIGH))
    cond = reason_of(plane, namespace, "high", names.REASON_PREEMPTION_BLOCKED)
    assert f"preemption would evict {namespace}/low" in cond["message"], cond
    assert "disruption budget keep-all" in cond["message"], cond
    assert cond["message"].startswith("0/1 nodes can host 1 x vir05_1c_16g: 1 insufficient")
    still_waits(plane, namespace, "high")
    assert untouched(plane, namespace, lows) == sorted(lows)
    assert nominated(plane, namespace, "high") == ""
    assert 'vnpu_operator_preemption_attempts_total{result="blocked"}' in (stack.operator.metrics())
    # The budget gone, the next try evicts one pod and places the pod. Budgets
    # are not watched: the next try comes after the backoff the last refusal
    # announced, which doubles per refusal (5 s, 10 s, 20 s...) and so depends
    # on how long the steps above took. Read after the delete, the condition
    # names the last refusal's delay: a try after the delete would have evicted.
    plane.kubectl("delete", "pdb", "-n", namespace, "keep-all")
    last = pod_waiting(plane, namespace, "high")
    found = re.search(r"trying again in (\d+)s", last.get("message", ""))
    delay = float(found.group(1)) if found else 0.0
    placed = pod_running(plane, namespace, "high", timeout=delay + 60)
    assert placed["spec"]["nodeName"] == NODE
    assert len(untouched(plane, namespace, lows)) == 3
    cleanup(plane, namespace)


def test_preemption_is_off_by_default(stack: Stack, plane: LocalPlane, namespace: str) -> None:
    restart_operator(stack, [])
    try:
        lows = fill(plane, namespace)
        create(plane, pod(namespace, "high", HIGH))
        reason_of(plane, namespace, "high", names.REASON_WAITING)
        still_waits(plane, namespace, "high")
        assert untouched(plane, namespace, lows) == sorted(lows)
        assert events(plane, namespace, names.REASON_PREEMPTED) == []
    finally:
        restart_operator(stack, list(ON))
    cleanup(plane, namespace)


def test_an_operator_restart_between_eviction_and_placement_keeps_the_claim(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    lows = fill(plane, namespace)
    stack.agent.kill()
    try:
        create(plane, pod(namespace, "high", HIGH))
        wait_for("one pod evicted", lambda: len(untouched(plane, namespace, lows)) == 3,
                 timeout=30)  # fmt: skip
        wait_for("claim written", lambda: nominated(plane, namespace, "high") == NODE, timeout=30)
        stack.operator.kill()  # SIGKILL: nothing is cleaned up on the way out
        stack.operator.start()
        # The claim is rebuilt from the pod: a third pod does not slip in,
        # and nobody else is evicted for the same pod.
        assert nominated(plane, namespace, "high") == NODE
        create(plane, pod(namespace, "third", LOW))
        cond = reason_of(plane, namespace, "third", names.REASON_WAITING)
        assert "capacity held for a preempting pod" in cond["message"], cond
        reason_of(plane, namespace, "high", names.REASON_PREEMPTING)
        still_waits(plane, namespace, "third")
        still_waits(plane, namespace, "high", seconds=0.5)
        assert len(untouched(plane, namespace, lows)) == 3
    finally:
        stack.agent.start()
    assert pod_running(plane, namespace, "high")["spec"]["nodeName"] == NODE
    wait_for("claim cleared", lambda: nominated(plane, namespace, "high") == "", timeout=30)
    still_waits(plane, namespace, "third")
    assert len(untouched(plane, namespace, lows)) == 3
    ids = held_ids(plane, namespace)
    assert len(ids) == len(set(ids)) == 4, ids
    cleanup(plane, namespace)


def test_the_watch_of_a_preempting_pod_shows_its_nominated_node(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """Without stopping the agent (the victim's vNPU goes at once), the claim
    is still written before the eviction and cleared after the placement:
    every version of the pod a watch delivers says so, in order."""
    fill(plane, namespace)
    watch = subprocess.Popen(
        [plane.binary("kubectl"), f"--kubeconfig={plane.kubeconfig}", "get", "pod", "-n",
         namespace, "--field-selector=metadata.name=high", "-w", "-o", "json"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        create(plane, pod(namespace, "high", HIGH))
        pod_running(plane, namespace, "high")
        wait_for("claim cleared", lambda: nominated(plane, namespace, "high") == "", timeout=30)
        time.sleep(1)
    finally:
        watch.terminate()
    out, _ = watch.communicate(timeout=10)
    decoder, seen, at = json.JSONDecoder(), [], 0
    while at < len(out.strip()):
        obj, end = decoder.raw_decode(out, at)
        seen.append(obj)
        at = end + (len(out[end:]) - len(out[end:].lstrip()))
    states = [
        (
            bool(p["spec"].get("schedulingGates")),
            (p.get("status") or {}).get("nominatedNodeName") or "",
        )
        for p in seen
    ]
    nominated_at = [i for i, (_, n) in enumerate(states) if n == NODE]
    assert nominated_at, states
    # Named while gated, and no longer once it runs.
    assert all(states[i][0] for i in nominated_at), states
    assert states[-1] == (False, ""), states
    cleanup(plane, namespace)


@pytest.mark.parametrize("enabled", [None, "false", "true"])
def test_the_chart_value_turns_preemption_and_its_eviction_right_on(
    plane: LocalPlane, enabled: str | None
) -> None:
    """Rendered by helm: the operator reads the variable the chart sets, and
    only an operator that may preempt may create evictions."""
    values = () if enabled is None else ("--set", f"operator.preemption.enabled={enabled}")
    rendered = template(plane, "--set", "agent.driver=sim", *values, namespace="vnpu-system")
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    on = enabled == "true"
    settings = OperatorSettings(preemption=env["VNPU_PREEMPTION"])  # type: ignore[arg-type]
    assert settings.preemption is on
    name = deployment["metadata"]["name"]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
    evict = [r for r in role["rules"] if "pods/eviction" in r.get("resources", [])]
    assert evict == ([{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
                     if on else [])  # fmt: skip
