"""The lifecycle decision: one step for any pod and allocation state."""

from __future__ import annotations

from typing import Any

import pytest

from localplane.pods import vnpu_pod
from vnpu_common.wire import names
from vnpu_common.wire.patches import finalizer_removal
from vnpu_operator.lifecycle import (
    AllocView,
    StepKind,
    decide,
    hand_edits,
    requested_count,
    unservable,
)
from vnpu_operator.pinning import pin_patch
from vnpu_operator.placement import PodRequest
from vnpu_operator.slim import slim_pod


def pod(
    *,
    gated: bool = True,
    deleting: bool = False,
    phase: str = "Pending",
    finalizer: bool = True,
    count: str | None = None,
) -> dict[str, Any]:
    return vnpu_pod(
        "p", "ns", uid="u1", template="vir05_1c_16g", count=count, containers=["c"],
        finalizers=[names.POD_FINALIZER] if finalizer else [],
        scheduling_gates=[names.SCHEDULING_GATE] if gated else [],
        phase=phase,
        metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else None,
    )  # fmt: skip


def alloc(
    i: int = 0, phase: str = names.PHASE_PENDING, *, deleting: bool = False, node: str = "n1"
) -> AllocView:
    return AllocView(
        key=f"ns/p-x-{i}", node=node, vnpu_id=100 + i, phase=phase, deleting=deleting,
        message="boom" if phase == names.PHASE_FAILED else "",
    )  # fmt: skip


def step(p: dict[str, Any], allocs: list[AllocView], **kw: Any) -> Any:
    kw.setdefault("attempts", 0)
    kw.setdefault("max_attempts", 3)
    return decide(p, allocs, **kw)


def test_new_gated_pod_is_placed() -> None:
    assert step(pod(), []).kind is StepKind.PLACE


def test_partial_booking_is_completed() -> None:
    assert step(pod(count="2"), [alloc(0, names.PHASE_READY)]).kind is StepKind.PLACE


def test_waits_while_the_agent_creates() -> None:
    s = step(pod(count="2"), [alloc(0, names.PHASE_READY), alloc(1)])
    assert s.kind is StepKind.WAIT


def test_all_ready_pins_to_their_node() -> None:
    s = step(pod(count="2"), [alloc(0, names.PHASE_READY), alloc(1, names.PHASE_READY)])
    assert (s.kind, s.keys, s.node) == (StepKind.PIN, ("ns/p-x-0", "ns/p-x-1"), "n1")


def test_started_pod_needs_nothing() -> None:
    assert step(pod(gated=False, phase="Running"), [alloc(0, names.PHASE_READY)]).kind is (
        StepKind.NOTHING
    )


@pytest.mark.parametrize(
    "p",
    [pod(deleting=True), pod(gated=False, phase="Succeeded"), pod(gated=False, phase="Failed")],
    ids=["deleted", "succeeded", "failed"],
)
def test_deleted_or_terminal_pod_releases_live_allocations(p: dict[str, Any]) -> None:
    s = step(p, [alloc(0, names.PHASE_READY), alloc(1, deleting=True)])
    assert (s.kind, s.keys) == (StepKind.RELEASE, ("ns/p-x-0",))


def started(*, grace: int = 30, phase: str = "Running", node: str | None = "n1") -> dict[str, Any]:
    """A deleted pod whose containers were started on `node`, as the API
    serves it during the grace period (`grace` is what is left of it)."""
    p = pod(gated=False, deleting=True, phase=phase)
    p["metadata"]["deletionGracePeriodSeconds"] = grace
    if node:
        p["spec"]["nodeName"] = node
    return p


def test_a_started_pod_keeps_its_vnpus_through_the_grace_period() -> None:
    # The kubelet has sent SIGTERM; the containers may still use the vNPU.
    s = step(started(), [alloc(0, names.PHASE_READY)])
    assert s.kind is StepKind.WAIT
    assert "containers" in s.message
    assert step(started(phase="Pending"), [alloc(0, names.PHASE_READY)]).kind is StepKind.WAIT


@pytest.mark.parametrize(
    ("p", "kw"),
    [
        (started(phase="Failed"), {}),  # the kubelet's terminal phase
        (started(phase="Succeeded"), {}),
        (started(grace=0), {}),  # the kubelet's final delete, or --force
        (started(node=None), {}),  # ungated but never bound: nothing ran
        (started(), {"node_gone": True}),  # no kubelet will ever report
    ],
    ids=["failed", "succeeded", "grace-0", "unbound", "node-gone"],
)
def test_a_started_pod_releases_once_no_container_can_run(
    p: dict[str, Any], kw: dict[str, Any]
) -> None:
    s = step(p, [alloc(0, names.PHASE_READY), alloc(1, deleting=True)], **kw)
    assert (s.kind, s.keys) == (StepKind.RELEASE, ("ns/p-x-0",))


def test_finalizer_stays_until_every_allocation_is_gone() -> None:
    assert step(pod(deleting=True), [alloc(0, deleting=True)]).kind is StepKind.WAIT
    assert step(pod(deleting=True), []).kind is StepKind.REMOVE_FINALIZER
    assert step(pod(deleting=True, finalizer=False), []).kind is StepKind.NOTHING


def test_pod_deleted_while_gated_and_unplaced_just_drops_the_finalizer() -> None:
    assert step(pod(deleting=True, gated=True), []).kind is StepKind.REMOVE_FINALIZER


def test_failed_allocation_releases_everything_and_names_the_node() -> None:
    s = step(
        pod(count="2"),
        [alloc(0, names.PHASE_READY, node="n2"), alloc(1, names.PHASE_FAILED, node="n2")],
    )
    assert (s.kind, s.keys, s.node, s.message) == (
        StepKind.RETRY,
        ("ns/p-x-0", "ns/p-x-1"),
        "n2",
        "boom",
    )


def test_replacement_waits_for_the_old_allocations_to_go() -> None:
    assert step(pod(), [alloc(0, names.PHASE_FAILED, deleting=True)]).kind is StepKind.WAIT


def test_attempts_exhausted_gives_up() -> None:
    assert step(pod(), [], attempts=3).kind is StepKind.GIVE_UP
    assert step(pod(), [], attempts=2).kind is StepKind.PLACE


def test_allocation_deleted_under_a_running_pod_is_reported_once_ours_are_excluded() -> None:
    running = pod(gated=False, phase="Running")
    gone = alloc(0, names.PHASE_READY, deleting=True)
    s = step(running, [gone])
    assert (s.kind, s.keys) == (StepKind.LOST, ("ns/p-x-0",))
    assert step(running, [gone], released_by_us={"ns/p-x-0"}).kind is StepKind.NOTHING
    assert step(running, [gone], lost_told={"ns/p-x-0"}).kind is StepKind.NOTHING


def test_an_allocation_that_vanished_unseen_is_lost_for_a_running_pod_only() -> None:
    # Deleted by someone else and gone before any reconcile saw it terminating.
    running = pod(gated=False, phase="Running")
    s = step(running, [alloc(1, names.PHASE_READY)], vanished={"ns/p-x-0"})
    assert (s.kind, s.keys) == (StepKind.LOST, ("ns/p-x-0",))
    assert step(running, [], vanished={"ns/p-x-0"}, lost_told={"ns/p-x-0"}).kind is (
        StepKind.NOTHING
    )
    # A gated pod re-places instead; a deleted one only releases what is left.
    assert step(pod(), [], vanished={"ns/p-x-0"}).kind is StepKind.PLACE
    deleted = pod(gated=False, deleting=True)
    assert step(deleted, [], vanished={"ns/p-x-0"}).kind is StepKind.REMOVE_FINALIZER


@pytest.mark.parametrize(
    ("raw", "expected"),
    # As the webhook reads vnpu.io/count: what it refuses counts 1.
    [(None, 1), ("3", 3), ("8", 8), (" 2 ", 1), ("x", 1), ("08", 1), ("9", 1), ("\uff12", 1)],
)
def test_requested_count(raw: str | None, expected: int) -> None:
    assert requested_count(pod(count=raw)) == expected


def test_alloc_view_reads_the_api_object() -> None:
    view = AllocView.from_api(
        {
            "metadata": {"namespace": "ns", "name": "a", "deletionTimestamp": "x"},
            "spec": {"nodeName": "n", "vnpuId": 104},
            "status": {"phase": "Failed", "message": "no room"},
        }
    )
    assert view == AllocView("ns/a", "n", 104, "Failed", True, "no room")
    assert AllocView.from_api({"metadata": {"namespace": "ns", "name": "b"}}).phase == "Pending"


def full_pod(**kwargs: Any) -> dict[str, Any]:
    """A pod as the API serves it: managedFields, containers, their statuses."""
    p = pod(**kwargs)
    p["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 3
    p["metadata"]["resourceVersion"] = "42"
    p["spec"].update(
        containers=[{"name": "c", "image": "busybox", "env": [{"name": "A", "value": "1"}]}],
        nodeSelector={"zone": "a"},
        tolerations=[{"key": "npu", "operator": "Exists"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}
                    ]
                }
            }
        },
        volumes=[{"name": "v", "emptyDir": {}}],
    )
    p["status"].update(containerStatuses=[{"name": "c", "ready": False}], hostIP="10.0.0.1")
    return p


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"gated": False}, {"deleting": True}, {"phase": "Succeeded"}, {"count": "2"}],
)
def test_the_slim_cached_pod_reads_like_the_full_one(kwargs: dict[str, Any]) -> None:
    full = full_pod(**kwargs)
    slim = slim_pod(full)
    assert "managedFields" not in slim["metadata"]
    assert "containers" not in slim["spec"]
    assert slim["status"] == {"phase": full["status"]["phase"]}
    allocs = [alloc(0, names.PHASE_READY), alloc(1, names.PHASE_READY)]
    for views in ([], allocs[:1], allocs):
        assert decide(slim, views, attempts=0, max_attempts=3) == decide(
            full, views, attempts=0, max_attempts=3
        )
    assert PodRequest.from_pod(slim) == PodRequest.from_pod(full)
    labels = {"kubernetes.io/hostname": "n1"}
    assert pin_patch(slim, "n1", labels, [3]) == pin_patch(full, "n1", labels, [3])
    assert finalizer_removal(slim["metadata"], names.POD_FINALIZER) == finalizer_removal(
        full["metadata"], names.POD_FINALIZER
    )
    # The Event about the pod names it the same way.
    for key in ("apiVersion", "kind"):
        assert slim[key] == full[key]
    assert {k: v for k, v in full["metadata"].items() if k != "managedFields"} == slim["metadata"]


def _alloc_obj(label: str | None, node: str = "n1") -> dict[str, Any]:
    labels = {names.LABEL_NODE: label} if label is not None else {}
    return {"metadata": {"name": "a", "labels": labels}, "spec": {"nodeName": node}}


def test_unservable_allocations_say_why() -> None:
    assert unservable(_alloc_obj("n1"), node_exists=True) is None
    assert "no vnpu.io/node label" in (unservable(_alloc_obj(None), node_exists=True) or "")
    assert "differs from spec.nodeName" in (unservable(_alloc_obj("n2"), node_exists=True) or "")
    assert unservable(_alloc_obj("n1"), node_exists=False) == "node n1 does not exist"


def test_hand_edits_of_what_the_system_decided_are_named() -> None:
    ready = [alloc(0, names.PHASE_READY)]
    running = pod(gated=False, phase="Running")
    running["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] = "100"
    assert hand_edits(running, ready) == []  # as the operator left it
    running["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] = "100,205"
    assert hand_edits(running, ready) == [
        "vnpu.io/visible-devices names vNPU 205, which no allocation of this pod holds"
    ]
    del running["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES]
    assert "started without vNPUs" in hand_edits(running, ready)[0]
    gated = pod()
    gated["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] = "100"
    assert "was set on a pod not yet given its vNPUs" in hand_edits(gated, [])[0]
    unfinalized = pod(finalizer=False)
    assert "finalizer was removed" in hand_edits(unfinalized, ready)[0]
    assert hand_edits(unfinalized, []) == []  # nothing to lose yet
    del gated["metadata"]["annotations"][names.ANN_TEMPLATE]
    assert "annotation was removed" in hand_edits(gated, [])[0]
    # A pod on its way out is not reported.
    assert hand_edits(pod(gated=False, deleting=True, finalizer=False), ready) == []
