"""The PLACE step: read the pod's request, choose node, chips and ids (or
learn that nothing fits yet), and create the allocation objects.

Placement decides and books in one synchronous ledger call, so pods placed
concurrently never share capacity; the objects are created afterwards, all
of a pod's at once, and a booking whose object could not be created is
given back.

A pod left holding part of its vNPUs (some creates failed: an API error,
a leader that stepped down between two of them, an operator killed between
them) is completed on the same node when it fits there. When it does not,
the part it holds is deleted and the pod placed again from nothing: held
partial bookings would otherwise wait for each other for good once the
cluster is full (two pods holding half a node each, found in a 1000-node
fill at exact capacity after leader step-downs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.informer import key_of
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.config import OperatorSettings
from vnpu_operator.kubeapi import OperatorApi, allocation_body
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.notices import TELL_AFTER_FAILURES, Notices
from vnpu_operator.placement import (
    MAX_COUNT,
    Allocation,
    InvalidRequestError,
    Ledger,
    NoFit,
    PlacementError,
    PodRequest,
)
from vnpu_operator.placement.nofit_memo import NoFitMemo
from vnpu_operator.podstate import Expectations, PodState, Write
from vnpu_operator.steps.preempt import Preemption, never_preempts

# The logger keeps its name from before the move into steps/: log lines read as before.
log = logging.getLogger("vnpu_operator.placing")


class Placer:
    def __init__(
        self,
        api: OperatorApi,
        notices: Notices,
        ledger: Ledger,
        expect: Expectations,
        settings: OperatorSettings,
        metrics: OperatorMetrics,
        preemption: Preemption,
        stopped_waiting: Callable[[PodState], None] = lambda state: None,
        started_waiting: Callable[[str], None] = lambda uid: None,
    ) -> None:
        """`stopped_waiting(state)`: a waiting pod was just booked (not yet
        created); the next alike waiting pod may fit too.
        `started_waiting(uid)`: the pod found no fit and is waiting (its
        state's `waiting_since` set)."""
        self.api = api
        self.stopped_waiting = stopped_waiting
        self.started_waiting = started_waiting
        self.preemption = preemption
        self.notices = notices
        self.ledger = ledger
        self.expect = expect
        self.settings = settings
        self.metrics = metrics
        self._nofits = NoFitMemo()

    async def give_back(
        self,
        pod: Raw,
        state: PodState,
        request: PodRequest,
        booked: Sequence[Allocation],
        nofit: NoFit,
        cached: Collection[str],
    ) -> None:
        """The pod holds part of its vNPUs on a node where the rest no longer
        fit: delete what it holds (its containers never started: it is
        gated), so that it is placed again from nothing once they are gone.
        A create still on its way is waited for first: deleting before it
        lands would leave its object behind."""
        held = [a.key for a in booked]
        if any(key not in cached for key in held):
            return  # decided again when the object reaches the cache
        node = booked[0].node
        state.given_back += 1
        log.warning(
            "pod %s: holds %d of %d vNPUs on %s and the rest no longer fit there (%s); "
            "giving them back to place it again", key_of(pod), len(held), request.count,
            node, nofit.message,
        )  # fmt: skip
        await self.notices.tell(
            pod, state, names.REASON_WAITING,
            f"{len(held)} of its {request.count} vNPUs were placed on node {node}, where the "
            "rest no longer fit; giving them back to place the pod again",
            condition=True, event_key="partial-given-back",
        )  # fmt: skip
        await self.expect.send_unsent(Write.DELETE, held, self.api.delete_allocation)

    def capacity_grew(self) -> None:
        self._nofits.capacity_grew()

    def still_waits(self, pod: Raw, state: PodState) -> bool:
        """Whether placing the waiting pod now would only find the NoFit it
        was last told, so that a retry would change nothing. A release at
        1000 nodes grows capacity hundreds of times, a quarter of a pod's
        worth at a time, and each retried the oldest alike pods (a
        reconcile each) to find what the first of them found. A pod that
        may preempt is always retried: its plan depends on more than what
        fits."""
        if self.preemption.enabled and not never_preempts(pod):
            return False
        try:
            request = PodRequest.from_pod(pod)
        except InvalidRequestError:
            return False
        nofit = self._nofits.peek(
            self.ledger, request, self.settings.placement_policy, avoid=frozenset(state.avoid)
        )
        return nofit is not None and nofit.message == state.condition

    async def place(
        self, pod: Raw, state: PodState, *, existing: Collection[str], cached: Collection[str]
    ) -> None:
        """`existing`: keys of the pod's allocations in the cache; `cached`:
        every allocation key in the cache."""
        try:
            request = PodRequest.from_pod(pod)
            # A new placement after a failure gets new object names: an agent
            # still releasing the old objects must never mistake the new ones.
            result = self._nofits.place(
                self.ledger,
                request,
                self.settings.placement_policy,
                avoid=frozenset(state.avoid),
                first_index=(state.attempts + state.given_back) * MAX_COUNT,
            )
        except InvalidRequestError as exc:
            self.metrics.placement_failures.labels("invalid-request").inc()
            await self.notices.tell(
                pod, state, names.REASON_INVALID_REQUEST, str(exc), condition=True, warning=True
            )
            return
        except PlacementError as exc:
            log.error("pod %s: placement refused: %s", key_of(pod), exc)
            await self.notices.tell(
                pod, state, names.REASON_PLACEMENT_CONFLICT, str(exc), condition=True, warning=True
            )
            return
        if isinstance(result, NoFit):
            if booked := self.ledger.allocations_for(request.uid):
                await self.give_back(pod, state, request, booked, result, cached)
                return
            if state.waiting_since is None:
                state.waiting_since = state.seen_at
            state.waiting_reason = result.primary_reason.value
            state.waiting_shape = self._nofits.signature(
                self.ledger, request, frozenset(state.avoid)
            )
            self.started_waiting(request.uid)
            self.metrics.placement_failures.labels(result.primary_reason.value).inc()
            if await self.preemption.after_nofit(pod, state, request, result):
                return
            await self.notices.tell(
                pod, state, names.REASON_WAITING, result.message, condition=True,
                event_key=result.primary_reason.value,
            )  # fmt: skip
            return
        if state.waiting_since is not None:
            self.stopped_waiting(state)
        # In the cache, or created and on its way there: nothing to write.
        bodies = {
            alloc.key: allocation_body(alloc, pod)
            for alloc in result.allocations
            if alloc.key not in existing and not self.expect.pending(Write.CREATE, alloc.key)
        }
        try:
            await self.expect.send_all(
                Write.CREATE, list(bodies), lambda key: self.api.create_allocation(bodies[key])
            )
        except Exception as exc:
            # The bookings whose objects do not exist must not outlive the
            # failed write; the ones created stay booked.
            for other in result.allocations:
                if other.key not in cached and not self.expect.pending(Write.CREATE, other.key):
                    self.ledger.remove_allocation(other.key)
            if isinstance(exc, ApiException | OSError | TimeoutError):
                state.write_failures += 1
                if state.write_failures >= TELL_AFTER_FAILURES:
                    what = f"create its VNPUAllocation on node {result.node}"
                    await self.notices.write_failed(pod, state, what, exc)
            raise
        state.write_failures = 0
        log.info("pod %s placed on %s: vNPU %s", key_of(pod), result.node, result.visible_devices)
        await self.preemption.release_claim(pod, state)
