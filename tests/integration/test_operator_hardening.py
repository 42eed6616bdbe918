"""Issue 12, the operator's side, tried as a careless admin and a flaky
control plane would: the API server killed during a churn, request
annotations removed after admission, pods force-finalized by hand, and
allocation objects that no agent will ever serve.

Node layout (prefix `hd-`): hd-a with 4 x 910B3 for the churn and most
tests; hd-t, one tainted 910B3 chip kept for the waiting-pod tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from operator_harness import Stack, StackOf, get_json, get_pod, pod_allocations

from localplane import LocalPlane, NodeSpec
from localplane.components import vnpu_ids
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names
from vnpu_operator.convergence import Convergence, Kind

pytestmark = pytest.mark.plane

TAINT = "hd-reserved"
CONVERGE_SECONDS = 2


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    nodes = [
        NodeSpec(name="hd-a", chips={"910B3": 4}),
        NodeSpec(
            name="hd-t",
            chips={"910B3": 1},
            taints=[{"key": TAINT, "value": "x", "effect": "NoSchedule"}],
        ),
    ]
    return stack_of(nodes, operator_extra=[f"--converge-seconds={CONVERGE_SECONDS}"])


def _pod(name: str, ns: str, **kw: Any) -> dict[str, Any]:
    return vnpu_pod(name, ns, node_selector={"kubernetes.io/hostname": "hd-a"}, **kw)


def _waiting_pod(name: str, ns: str) -> dict[str, Any]:
    """Asks for more than hd-t has (tolerating its taint, nothing else fits
    its selector): admitted, gated, waiting for capacity."""
    pod = vnpu_pod(name, ns, count=2, node_selector={"kubernetes.io/hostname": "hd-t"})
    pod["spec"]["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def _phase(plane: LocalPlane, ns: str, name: str) -> str | None:
    pod = get_pod(plane, ns, name)
    return None if pod is None else (pod.get("status") or {}).get("phase")


def _running(plane: LocalPlane, ns: str, name: str) -> tuple[str, dict[str, Any]]:
    """Creates a one-vNPU pod on hd-a and waits until it runs: its uid and allocation."""
    plane.apply(_pod(name, ns))
    wait_for(f"pod {name} Running", lambda: _phase(plane, ns, name) == "Running", timeout=60)
    pod = get_pod(plane, ns, name)
    assert pod is not None
    uid = pod["metadata"]["uid"]
    (alloc,) = pod_allocations(plane, ns, uid)
    return uid, alloc


def _sim_ids(stack: Stack, node: str) -> dict[int, str]:
    return vnpu_ids(stack.agent.sim(node))


def _json_patch(plane: LocalPlane, ns: str, name: str, ops: list[dict[str, Any]]) -> None:
    plane.kubectl("patch", "pod", "-n", ns, name, "--type=json", "-p", json.dumps(ops))


def _drop_template(plane: LocalPlane, ns: str, name: str) -> None:
    # As the admin: the protection policy lets cluster admins through (the
    # careless admin of this issue); an ordinary user is refused.
    path = "/metadata/annotations/" + names.ANN_TEMPLATE.replace("/", "~1")
    _json_patch(plane, ns, name, [{"op": "remove", "path": path}])


def _wait_gone(plane: LocalPlane, ns: str, name: str, timeout: float = 60) -> None:
    wait_for(f"pod {ns}/{name} gone", lambda: get_pod(plane, ns, name) is None, timeout=timeout)


# ------------------------------------------------ 1. lost deletions converge


def test_convergence_forgets_what_a_fresh_listing_no_longer_shows(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """The mechanism on the real API: a metadata-only list read in pages,
    resourceVersions compared, and only objects older than the list
    forgotten. Pages of two: a pass that read only the first page would
    forget the kept objects on the others."""
    kept = [f"keep-{i}" for i in range(5)]
    for name in [*kept, "doomed"]:
        plane.kubectl("create", "configmap", name, "-n", namespace)
    cache = {name: get_json(plane, "configmap", "-n", namespace, name) for name in kept}
    cache["doomed"] = get_json(plane, "configmap", "-n", namespace, "doomed")
    plane.kubectl("delete", "configmap", "-n", namespace, "doomed")
    future = {"metadata": {"name": "later", "namespace": namespace, "resourceVersion": "9" * 15}}
    cache["later"] = future
    gone: list[str] = []

    async def run() -> int:
        from kubernetes_asyncio import client, config

        await config.load_kube_config(config_file=str(plane.kubeconfig))
        async with client.ApiClient() as api_client:
            kind = Kind(
                "configmap",
                f"/api/v1/namespaces/{namespace}/configmaps",
                lambda: cache,
                lambda obj: gone.append(obj["metadata"]["name"]),
            )
            convergence = Convergence(api_client, [kind], interval=1, retry_max=1, page_size=2)
            listing = await convergence.list_keys(kind)
            assert {f"{namespace}/{n}" for n in kept} <= listing.keys
            return await convergence.converge()

    import asyncio

    assert asyncio.run(run()) == 1
    # "later" is absent too, but seen at a version newer than the list.
    assert gone == ["doomed"]


def test_a_deletion_made_while_the_operator_was_away_from_a_restarted_api_server_is_seen(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """Deterministic form of the churn below: the operator is frozen across
    an API server restart, and the pod's deletion and its allocation's whole
    release happen before it reconnects. Its watch then resumes too late (410)
    and Kopf re-lists: the allocation is simply absent, no DELETED ever comes.
    Without convergence the pod stays Terminating for good."""
    _, alloc = _running(plane, namespace, "away")
    name, vnpu_id = alloc["metadata"]["name"], alloc["spec"]["vnpuId"]

    proc = stack.operator.proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        plane.restart_apiserver()
        plane.kubectl("delete", "pod", "-n", namespace, "away", "--wait=false")
        # What the operator would have done; the agent destroys the vNPU and
        # removes its finalizer, all while the operator sees nothing.
        plane.kubectl("delete", names.ALLOCATION_PLURAL, "-n", namespace, name, "--wait=false")
        wait_for(
            "allocation released by the agent",
            lambda: get_json(plane, names.ALLOCATION_PLURAL, "-n", namespace, name) is None,
            timeout=60,
        )
        assert vnpu_id not in _sim_ids(stack, "hd-a")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _wait_gone(plane, namespace, "away", timeout=40)


def test_api_server_killed_twice_during_a_churn_leaves_nothing_stuck_or_leaked(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    count = 12
    for i in range(count):
        plane.apply(_pod(f"churn-{i}", namespace))
    wait_for(
        "churn pods Running",
        lambda: all(_phase(plane, namespace, f"churn-{i}") == "Running" for i in range(count)),
        timeout=120,
    )
    assert len(_sim_ids(stack, "hd-a")) == count

    # Deletions in flight while the API server dies, twice: watch streams
    # break, and a resumed one may no longer reach the events it missed.
    for batch in (range(0, count // 2), range(count // 2, count)):
        for i in batch:
            plane.kubectl("delete", "pod", "-n", namespace, f"churn-{i}", "--wait=false")
        time.sleep(0.5)
        plane.restart_apiserver()

    left: list[str] = []

    def settled() -> bool:
        pods = get_json(plane, "pods", "-n", namespace) or {}
        allocs = get_json(plane, names.ALLOCATION_PLURAL, "-n", namespace) or {}
        left[:] = [
            f"{o['kind']} {o['metadata']['name']} deleting="
            f"{bool(o['metadata'].get('deletionTimestamp'))} "
            f"finalizers={o['metadata'].get('finalizers')}"
            for o in [*pods.get("items", []), *allocs.get("items", [])]
        ]
        return not left

    try:
        wait_for("every churn pod and allocation gone", settled, timeout=180, interval=1)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; left: {left}\noperator:\n{stack.operator.log_tail(60)}"
            f"\nagent:\n{stack.agent.log_tail(30)}"
        ) from exc
    assert _sim_ids(stack, "hd-a") == {}, "vNPUs leaked"
    # Both report ready again once their watches have re-listed (with backoff).
    wait_for("operator ready again", stack.operator.ready, timeout=60)
    wait_for("agent ready again", stack.agent.ready, timeout=60)


# ------------------------------- 3. admitted pods are managed to their end


def test_a_running_pod_whose_request_annotation_was_removed_is_still_released(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    uid, alloc = _running(plane, namespace, "edited")
    vnpu_id = alloc["spec"]["vnpuId"]

    _drop_template(plane, namespace, "edited")
    assert "annotation was removed" in _hand_edit_event(plane, namespace, "edited")
    plane.kubectl("delete", "pod", "-n", namespace, "edited", "--wait=false")

    _wait_gone(plane, namespace, "edited")
    assert pod_allocations(plane, namespace, uid) == []
    assert vnpu_id not in _sim_ids(stack, "hd-a")


def test_a_gated_pod_whose_request_annotation_was_removed_is_still_released(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(_waiting_pod("gated-edit", namespace))
    wait_for(
        "pod told it waits",
        lambda: (get_pod(plane, namespace, "gated-edit") or {}).get("status", {}).get("conditions"),
        timeout=60,
    )
    _drop_template(plane, namespace, "gated-edit")
    plane.kubectl("delete", "pod", "-n", namespace, "gated-edit", "--wait=false")
    _wait_gone(plane, namespace, "gated-edit")


def _drop_managed_label(plane: LocalPlane, ns: str, name: str) -> None:
    # As the admin (the label is no request annotation; nothing refuses
    # its removal): the pod watch selects on it (watches.pod_informer).
    plane.kubectl("label", "pod", "-n", ns, name, f"{names.LABEL_MANAGED}-")


def _labelled(plane: LocalPlane, ns: str, name: str) -> bool:
    labels = ((get_pod(plane, ns, name) or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(names.LABEL_MANAGED) == "true"


def test_a_running_pod_whose_managed_label_was_removed_is_relabelled_and_released(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    uid, alloc = _running(plane, namespace, "unlabelled")
    vnpu_id = alloc["spec"]["vnpuId"]
    _drop_managed_label(plane, namespace, "unlabelled")
    wait_for("label put back", lambda: _labelled(plane, namespace, "unlabelled"), timeout=30)
    # The pod kept its vNPU while unlabelled: it was never taken for gone.
    assert vnpu_id in _sim_ids(stack, "hd-a")
    assert [a["spec"]["vnpuId"] for a in pod_allocations(plane, namespace, uid)] == [vnpu_id]
    # Unlabelled again and deleted at once: the deletion is not lost.
    _drop_managed_label(plane, namespace, "unlabelled")
    plane.kubectl("delete", "pod", "-n", namespace, "unlabelled", "--wait=false")
    _wait_gone(plane, namespace, "unlabelled")
    assert pod_allocations(plane, namespace, uid) == []
    assert vnpu_id not in _sim_ids(stack, "hd-a")


def test_a_waiting_pod_whose_managed_label_was_removed_is_still_placed_and_released(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(_waiting_pod("unlabelled-gated", namespace))
    wait_for(
        "pod told it waits",
        lambda: (
            (get_pod(plane, namespace, "unlabelled-gated") or {})
            .get("status", {})
            .get("conditions")
        ),
        timeout=60,
    )
    _drop_managed_label(plane, namespace, "unlabelled-gated")
    wait_for("label put back", lambda: _labelled(plane, namespace, "unlabelled-gated"), timeout=30)
    plane.kubectl("delete", "pod", "-n", namespace, "unlabelled-gated", "--wait=false")
    _wait_gone(plane, namespace, "unlabelled-gated")


def test_a_pod_gone_behind_the_operators_back_is_never_placed(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    """The careless admin: request annotation removed, finalizer removed by
    hand, pod deleted. Then capacity frees: nothing may be placed for it."""
    plane.apply(_waiting_pod("forced", namespace))
    wait_for(
        "pod waiting",
        lambda: (get_pod(plane, namespace, "forced") or {}).get("status", {}).get("conditions"),
        timeout=60,
    )
    pod = get_pod(plane, namespace, "forced")
    assert pod is not None
    uid = pod["metadata"]["uid"]
    _drop_template(plane, namespace, "forced")
    finalizers = pod["metadata"]["finalizers"]
    _json_patch(
        plane,
        namespace,
        "forced",
        [
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "replace", "path": "/metadata/finalizers", "value": []},
        ],
    )
    plane.kubectl("delete", "pod", "-n", namespace, "forced", "--wait=false")
    _wait_gone(plane, namespace, "forced", timeout=30)

    # Capacity on every node changes: a phantom waiting pod would be placed now.
    plane.apply(_pod("other", namespace))
    wait_for("other Running", lambda: _phase(plane, namespace, "other") == "Running", timeout=60)
    plane.kubectl("delete", "pod", "-n", namespace, "other", "--wait=false")
    _wait_gone(plane, namespace, "other")
    deadline = time.monotonic() + 3 * CONVERGE_SECONDS + 2
    while time.monotonic() < deadline:
        assert pod_allocations(plane, namespace, uid) == [], "placed a pod that is gone"
        time.sleep(0.3)
    assert len(_sim_ids(stack, "hd-t")) == 0


def _hand_edit_event(plane: LocalPlane, ns: str, name: str, *, containing: str = "") -> str:
    def found() -> str | None:
        events = get_json(
            plane, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
        )
        for e in (events or {}).get("items", []):
            if e.get("reason") == names.REASON_HAND_EDIT and containing in e.get("message", ""):
                return str(e["message"])
        return None

    message: str = wait_for(f"{names.REASON_HAND_EDIT} Event on {name}", found, timeout=30)
    return message


def test_an_exempt_admins_edit_of_visible_devices_is_reported_on_the_pod(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    _running(plane, namespace, "pointed")
    plane.kubectl(
        "annotate", "pod", "-n", namespace, "pointed", f"{names.ANN_VISIBLE_DEVICES}=1099",
        "--overwrite",
    )  # fmt: skip
    message = _hand_edit_event(plane, namespace, "pointed", containing="1099")
    assert "no allocation of this pod holds" in message, message
    plane.kubectl("delete", "pod", "-n", namespace, "pointed", "--wait=false")
    _wait_gone(plane, namespace, "pointed")


# ------------------------------------- 6. allocations no agent will serve


@contextlib.contextmanager
def _without_policies(plane: LocalPlane) -> Iterator[None]:
    """Objects made before the protection policies existed (or by an admin
    who lifted them): today the operator alone may create allocations, and
    only well-labelled ones."""
    plane.remove_policies()
    try:
        yield
    finally:
        plane.install_policies()


def _allocation(ns: str, name: str, *, node: str, label: str | None) -> dict[str, Any]:
    labels = {names.LABEL_POD_UID: f"uid-{name}"}
    if label is not None:
        labels[names.LABEL_NODE] = label
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "finalizers": [names.ALLOCATION_FINALIZER],
        },
        "spec": {
            "podName": f"pod-{name}",
            "podUID": f"uid-{name}",
            "nodeName": node,
            "chip": 0,
            "template": "vir05_1c_16g",
            "vnpuId": 900,
        },
    }


@pytest.mark.parametrize(
    ("node", "label", "why"),
    [
        ("hd-a", None, "no vnpu.io/node label"),
        ("hd-a", "hd-t", "differs from spec.nodeName"),
        ("hd-ghost", "hd-ghost", "node hd-ghost does not exist"),
    ],
)
def test_an_allocation_no_agent_serves_says_why_and_does_not_stay_terminating(
    stack: Stack, plane: LocalPlane, namespace: str, node: str, label: str | None, why: str
) -> None:
    name = f"unservable-{node}-{label or 'none'}".lower()
    with _without_policies(plane):
        plane.apply(_allocation(namespace, name, node=node, label=label))

    # Its pod does not exist: the operator releases it; no agent ever will
    # remove its finalizer, so the operator does, and says why.
    wait_for(
        f"allocation {name} gone",
        lambda: get_json(plane, names.ALLOCATION_PLURAL, "-n", namespace, name) is None,
        timeout=60,
    )
    events = get_json(
        plane, "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )
    unservable = [
        e for e in (events or {}).get("items", []) if e.get("reason") == names.REASON_UNSERVABLE
    ]
    assert unservable, f"no {names.REASON_UNSERVABLE} Event on {name}"
    assert why in unservable[-1]["message"], unservable[-1]
    assert stack.operator.ready()
