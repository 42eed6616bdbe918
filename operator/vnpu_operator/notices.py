"""What pods are told, and when: Events and the vnpu.io/Allocated condition.

A pod hears each thing once: the condition is rewritten only when its
message changes, an Event is posted only when its reason (or what it is
about) changes, so a pod waiting through changing capacity is not
re-announced for every count that moves. The memory of what was said is the
pod's `PodState`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.rawcall import describe
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.podstate import PodState

log = logging.getLogger(__name__)

# API answers that refuse the write itself (a policy, RBAC, validation): the
# same write gets the same answer until an admin changes something.
REFUSED_STATUSES = frozenset({400, 401, 403, 422})

# A pod is told once its writes failed this many times in a row: one failure
# is often a conflict or a restart the next try gets past.
TELL_AFTER_FAILURES = 2


def write_failure(what: str, exc: BaseException) -> tuple[str, str, str]:
    """(reason, message, event key) for the pod whose write `what` failed with
    `exc`: the API server's own message, never the body."""
    if isinstance(exc, ApiException) and exc.status in REFUSED_STATUSES:
        reason = names.REASON_WRITE_REFUSED
        said = f"the API server refused to {what}"
    else:
        reason = names.REASON_API_ERROR
        said = f"the operator could not {what}"
    status = str(exc.status) if isinstance(exc, ApiException) else type(exc).__name__
    return reason, f"{said} ({describe(exc)}); retrying", status


class Notices:
    def __init__(self, api: OperatorApi) -> None:
        self.api = api

    async def write_failed(self, pod: Raw, state: PodState, what: str, exc: BaseException) -> None:
        """The pod's writes keep failing: the vnpu.io/Allocated condition and
        one Event (per reason and status) say why, in the API server's words.
        Telling may fail too (a credential refused everything): logged, the
        write's own failure is what the caller raises."""
        reason, message, key = write_failure(what, exc)
        try:
            await self.tell(
                pod, state, reason, message, condition=True, warning=True, event_key=key
            )
        except Exception as told:  # the write's own error is the one raised
            log.warning("could not tell the pod why its writes fail: %s", describe(told))

    async def tell(
        self,
        pod: Raw,
        state: PodState,
        reason: str,
        message: str,
        *,
        condition: bool = False,
        warning: bool = False,
        event_key: str | None = None,
    ) -> None:
        """Why the pod is not running yet (a condition if `condition`) and an
        Event; `event_key` names what the Event is about when the message
        carries counts that change."""
        event_id = f"{reason}/{event_key or message}"
        if condition and state.condition != message:
            await self.api.set_pod_condition(pod, "False", reason, message)
            state.condition = message
        if state.announced != event_id:
            await self.api.event(pod, reason=reason, message=message, warning=warning)
            state.announced = event_id

    async def ready(
        self, pod: Raw, state: PodState, ids: Sequence[int], templates: Sequence[str], node: str
    ) -> None:
        devices = ",".join(str(i) for i in ids)
        if state.told:
            # Only a pod that was told why it waits needs the condition turned.
            await self.api.set_pod_condition(
                pod, "True", names.REASON_ALLOCATED, f"vNPU {devices} on node {node}"
            )
            state.announced = state.condition = ""
        await self.api.event(
            pod,
            reason=names.REASON_VNPUS_READY,
            message=f"vNPU {devices} ({', '.join(templates)}) ready on node {node}; "
            "pod pinned there and ungated",
        )

    async def placement_failed(self, pod: Raw, node: str, why: str, attempts_left: int) -> None:
        then = (
            f"placing elsewhere ({attempts_left} attempt(s) left)"
            if attempts_left > 0
            else "no attempts left"
        )
        await self.api.event(
            pod,
            reason=names.REASON_ALLOCATION_FAILED,
            warning=True,
            message=f"vNPU on node {node} failed: {why}; {then}",
        )

    async def lost(self, pod: Raw, key: str, what: str) -> None:
        await self.api.event(
            pod,
            reason=names.REASON_RELEASED_EXTERNALLY,
            warning=True,
            message=f"allocation {key} ({what}) was deleted while the pod runs; the vNPU "
            "is destroyed and the pod keeps no device there",
        )

    async def node_not_live(self, pod: Raw, node: str, why: str) -> None:
        await self.api.event(
            pod,
            reason=names.REASON_NODE_NOT_LIVE,
            warning=True,
            message=f"node {node} is not live ({why}); its vNPUs are kept and "
            "released once the agent is back",
        )

    async def unservable(self, alloc: Raw, why: str, *, released: bool = False) -> None:
        """On the allocation object itself: nobody else will explain it."""
        meta = alloc.get("metadata") or {}
        if released:
            message = (
                f"no agent will ever destroy this vNPU: {why}; the operator removed "
                f"{names.ALLOCATION_FINALIZER} (if the vNPU exists, its node's agent "
                "collects it as an orphan)"
            )
        else:
            message = (
                f"no agent will act on this allocation: {why}; delete it (kubectl delete "
                f"vnpuallocation -n {meta.get('namespace')} {meta.get('name')}) and the "
                "operator releases it"
            )
        await self.api.event(alloc, reason=names.REASON_UNSERVABLE, message=message, warning=True)

    async def preempted(self, victim: Raw, by: str, priority: int, node: str) -> None:
        """On the evicted pod, in the words kube-scheduler uses for its own."""
        await self.api.event(
            victim,
            reason=names.REASON_PREEMPTED,
            message=f"preempted by {by} (priority {priority}) to free vNPU capacity on node {node}",
        )

    async def hand_edit(self, pod: Raw, what: str) -> None:
        await self.api.event(
            pod,
            reason=names.REASON_HAND_EDIT,
            warning=True,
            message=f"{what}; only the vnpu-operator should change this (an exempt cluster "
            "admin did)",
        )

    async def released(self, pod: Raw) -> None:
        """Only for a pod that ended and stays visible: for a deleted pod the
        Event would describe an object about to vanish."""
        await self.api.event(
            pod,
            reason=names.REASON_VNPUS_RELEASED,
            message=f"pod is {pod.get('status', {}).get('phase')}; its vNPUs are destroyed",
        )
