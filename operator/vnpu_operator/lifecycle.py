"""The pod lifecycle as a pure function: what to do next for one pod.

`decide` looks at a pod and the allocation objects that name it and returns
one step. The controller executes the step and calls `decide` again when
anything about the pod or its allocations changes, so every step is
idempotent and an operator restarted at any point resumes from the objects.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from vnpu_common.wire import names
from vnpu_operator.annotations import parse_annotations

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class StepKind(StrEnum):
    NOTHING = "nothing"
    # Release: delete these allocation objects (the agent destroys the vNPUs).
    RELEASE = "release"
    # Released: no allocation of the pod is left; remove the pod finalizer.
    REMOVE_FINALIZER = "remove-finalizer"
    # Waiting for the agents (creating or destroying vNPUs).
    WAIT = "wait"
    # Choose node, chips and ids, then create the allocation objects.
    PLACE = "place"
    # Every vNPU is Ready: pin, publish the ids, ungate, in one pod patch.
    PIN = "pin"
    # An allocation Failed: delete all of the pod's allocations, place elsewhere.
    RETRY = "retry"
    # Placement attempts exhausted: tell the pod, stay gated.
    GIVE_UP = "give-up"
    # An allocation of a started pod was deleted by someone else.
    LOST = "lost"


@dataclass(frozen=True)
class AllocView:
    """The parts of a VNPUAllocation object the lifecycle reads."""

    key: str
    node: str
    vnpu_id: int
    phase: str
    deleting: bool
    message: str = ""

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> AllocView:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return cls(
            key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            node=str(spec.get("nodeName", "")),
            vnpu_id=int(spec.get("vnpuId", -1)),
            phase=str(status.get("phase") or names.PHASE_PENDING),
            deleting=bool(meta.get("deletionTimestamp")),
            message=str(status.get("message") or ""),
        )


@dataclass(frozen=True)
class Step:
    kind: StepKind
    keys: tuple[str, ...] = ()
    message: str = ""
    node: str = ""


def is_gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == names.SCHEDULING_GATE for g in gates)


def is_deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def containers_stopped(pod: Mapping[str, Any], *, node_gone: bool = False) -> bool:
    """Whether no container of the pod can be running, so its vNPUs may go.

    A deleted pod's containers run on through their grace period (a real
    kubelet sends SIGTERM and waits up to terminationGracePeriodSeconds),
    and a vNPU destroyed then is pulled from under a running process. They
    are known stopped when the kubelet has moved the pod to a terminal
    phase (it does so before its final delete), when the pod is deleted
    with grace 0 (the kubelet's final delete, a forced delete, the pod
    garbage collector), when no container was ever started (still gated,
    or never bound), or when its node is gone.
    """
    meta = pod.get("metadata") or {}
    return (
        is_terminal(pod)
        or meta.get("deletionGracePeriodSeconds") == 0
        or is_gated(pod)
        or not (pod.get("spec") or {}).get("nodeName")
        or node_gone
    )


def has_finalizer(pod: Mapping[str, Any]) -> bool:
    return names.POD_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


def requested_count(pod: Mapping[str, Any]) -> int:
    """The count annotation as the webhook reads it, 1 when absent or
    malformed (placement reports a malformed one with the webhook's message).
    Cached pods have no containers to match vnpu.io/containers against."""
    return parse_annotations(pod, match_containers=False).count


def hand_edits(pod: Mapping[str, Any], allocs: Sequence[AllocView]) -> list[str]:
    """What someone other than the operator changed on a pod it admitted, in
    words a pod's owner can act on. The protection policy refuses these edits
    to everyone but the operator and exempt cluster admins; an admin's edit
    still deserves a trace on the pod, which this reading gives."""
    if is_deleting(pod) or is_terminal(pod):
        return []
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    found = []
    if names.ANN_TEMPLATE not in annotations:
        found.append(f"the {names.ANN_TEMPLATE} annotation was removed")
    if allocs and not has_finalizer(pod):
        found.append(
            f"the {names.POD_FINALIZER} finalizer was removed: the pod object may go "
            "before its vNPUs are destroyed"
        )
    shown = annotations.get(names.ANN_VISIBLE_DEVICES)
    if is_gated(pod):
        if shown is not None:
            found.append(f"{names.ANN_VISIBLE_DEVICES} was set on a pod not yet given its vNPUs")
        return found
    if shown is None:
        found.append(
            "the pod started without vNPUs: the scheduling gate or "
            f"{names.ANN_VISIBLE_DEVICES} was removed by hand"
        )
        return found
    held = {a.vnpu_id for a in allocs}
    foreign = sorted(set(str(shown).split(",")) - {str(i) for i in held})
    if allocs and foreign:
        found.append(
            f"{names.ANN_VISIBLE_DEVICES} names vNPU {','.join(foreign)}, which no allocation "
            "of this pod holds"
        )
    return found


def unservable(obj: Mapping[str, Any], *, node_exists: bool) -> str | None:
    """Why no agent will ever act on this allocation object, or None.

    Agents select allocations by the vnpu.io/node label and serve the nodes
    they run on; an object without the label, with a label that differs from
    spec.nodeName, or naming a node that is gone, would stay Terminating for
    good once deleted, its vnpu.io/vnpu-destroy finalizer never removed."""
    meta = obj.get("metadata") or {}
    label = (meta.get("labels") or {}).get(names.LABEL_NODE)
    node = (obj.get("spec") or {}).get("nodeName")
    if not label:
        return f"it has no {names.LABEL_NODE} label, which agents select allocations by"
    if label != node:
        return f"its {names.LABEL_NODE} label ({label}) differs from spec.nodeName ({node})"
    if not node_exists:
        return f"node {node} does not exist"
    return None


def decide(
    pod: Mapping[str, Any],
    allocs: Sequence[AllocView],
    *,
    attempts: int,
    max_attempts: int,
    released_by_us: Collection[str] = (),
    vanished: Collection[str] = (),
    lost_told: Collection[str] = (),
    node_gone: bool = False,
) -> Step:
    """The next step for `pod`, given all allocation objects that name it.

    `attempts` counts placements whose vNPUs failed; `released_by_us` holds
    the keys of allocations this operator deleted, to tell a release we asked
    for from one somebody else did. `vanished` holds keys of the pod's
    allocations that are gone without the operator deleting them (the
    deletion may have passed before any reconcile saw it terminating), and
    `lost_told` those whose loss the pod has been told of already.
    `node_gone`: the pod's node exists no more (no Node, no live Lease).
    """
    live = tuple(a.key for a in allocs if not a.deleting)
    if is_deleting(pod) or is_terminal(pod):
        if live:
            if not containers_stopped(pod, node_gone=node_gone):
                return Step(StepKind.WAIT, message="containers stopping; vNPUs kept until then")
            return Step(StepKind.RELEASE, live)
        if allocs:
            return Step(StepKind.WAIT, message="vNPUs being destroyed")
        if has_finalizer(pod):
            return Step(StepKind.REMOVE_FINALIZER)
        return Step(StepKind.NOTHING)

    if not is_gated(pod):
        # Started (or never gated): its vNPUs are fixed for its lifetime.
        lost = tuple(
            sorted(
                {a.key for a in allocs if a.deleting and a.key not in released_by_us}.union(
                    vanished
                ).difference(lost_told)
            )
        )
        if lost:
            return Step(StepKind.LOST, lost)
        return Step(StepKind.NOTHING)

    failed = [a for a in allocs if a.phase == names.PHASE_FAILED and not a.deleting]
    if failed:
        first = failed[0]
        return Step(StepKind.RETRY, live, message=first.message or "vNPU creation failed",
                    node=first.node)  # fmt: skip
    if any(a.deleting for a in allocs):
        return Step(StepKind.WAIT, message="previous vNPUs being destroyed")
    if not allocs:
        if attempts >= max_attempts:
            return Step(StepKind.GIVE_UP)
        return Step(StepKind.PLACE)
    if len(allocs) < requested_count(pod):
        return Step(StepKind.PLACE)
    if all(a.phase == names.PHASE_READY for a in allocs):
        return Step(StepKind.PIN, tuple(a.key for a in allocs), node=allocs[0].node)
    return Step(StepKind.WAIT, message="vNPUs being created")
