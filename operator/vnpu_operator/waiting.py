"""The waiting line: pods the ledger found no room for, oldest first, and
when each is retried.

A pod enters the line when placement finds nothing that fits
(`PodState.waiting_since`, set by the PLACE step, which calls `enter`) and
leaves it when booked, deleted, ended or given up. When capacity may have
grown, the oldest `WIDTH` pods of each request shape are retried (`retry`),
once per burst of changes, those whose answer would not change skipped
(`still_waits`); when one leaves the line (`stop`), the next alike pod
takes its place."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Hashable, Mapping

from vnpu_common.wire.types import Raw
from vnpu_operator.metrics import WaitingPod
from vnpu_operator.podstate import PodState

# Alike waiting pods tried at once. One at a time, a release of 100 pods'
# capacity at 1000 nodes placed the 100 waiting ones in a chain, one event-
# loop turn each: on a busy 2-core machine 2.2 s (p50) from the capacity
# free to the pod placed. Those of the WIDTH that find nothing cost a
# remembered NoFit each (NoFitMemo), not a search.
WIDTH = 8


class WaitingLine:
    def __init__(
        self,
        states: Mapping[str, PodState],
        pods: Mapping[str, Raw],
        *,
        clock: Callable[[], float],
        kick: Callable[[str], None] = lambda _uid: None,
        still_waits: Callable[[Raw, PodState], bool] = lambda _pod, _state: False,
        width: int = WIDTH,
    ) -> None:
        """`states`, `pods`: the controller's records and cache of pods (by
        uid); `kick(uid)`: reconcile a pod (the controller's queue: a pod
        already queued is not queued twice); `still_waits(pod, state)`: a
        retry would find what the pod was last told (it keeps its turn
        without one)."""
        self.states = states
        self.pods = pods
        self.clock = clock
        self.kick = kick
        self.still_waits = still_waits
        self.width = width
        self._pending: asyncio.Handle | None = None
        # The pods that entered the line, some of which may have left it
        # since (`order` drops those): the line is read on every capacity
        # change, and walking every pod's state there was a twentieth of the
        # operator's CPU in a release at 1000 nodes with 2000 pods running.
        self._entered: dict[str, None] = {}

    def enter(self, uid: str) -> None:
        """The pod found no fit (its state's `waiting_since` is set)."""
        self._entered[uid] = None

    @property
    def pending(self) -> bool:
        """A retry is scheduled and has not run yet."""
        return self._pending is not None

    def order(self) -> list[str]:
        """Pods waiting for capacity, oldest first."""
        waiting: list[tuple[float, str]] = []
        left: list[str] = []
        for uid in self._entered:
            state = self.states.get(uid)
            if state is None or state.waiting_since is None:
                left.append(uid)
            else:
                waiting.append((state.waiting_since, uid))
        for uid in left:
            del self._entered[uid]
        return [uid for _, uid in sorted(waiting)]

    def waiting_pods(self) -> list[WaitingPod]:
        """The waiting pods as metrics name them (a pod the cache no longer
        holds is about to be forgotten, and is left out)."""
        now = self.clock()
        out: list[WaitingPod] = []
        for uid in self.order():
            state, pod = self.states[uid], self.pods.get(uid)
            if state.waiting_since is None or pod is None:
                continue
            meta = pod.get("metadata") or {}
            out.append(
                WaitingPod(
                    namespace=str(meta.get("namespace", "")),
                    pod=str(meta.get("name", "")),
                    reason=state.waiting_reason,
                    waited_seconds=now - state.waiting_since,
                )
            )
        return out

    def retry(self) -> None:
        """Capacity may have grown: retry waiting pods, oldest first, once
        per burst of changes."""
        if self._pending is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return

        def go() -> None:
            self._pending = None
            self._kick_heads()

        self._pending = loop.call_soon(go)

    def _kick_heads(self, shapes: Collection[Hashable] | None = None) -> None:
        """Retries the oldest `width` waiting pods of each request shape (of
        `shapes` only, if given) and every pod placed afresh each time. The
        others of a shape would find what its oldest find: a release at 1000
        nodes with 100 alike pods waiting retried all 100 for each of its 400
        allocations, seconds of CPU before the one that fit was placed."""
        taken: dict[Hashable, int] = {}
        for uid in self.order():
            shape = self.states[uid].waiting_shape
            if shape is None:
                if shapes is None:
                    self.kick(uid)
                continue
            if shapes is not None and shape not in shapes:
                continue
            turns = taken.get(shape, 0)
            if turns >= self.width:
                continue
            taken[shape] = turns + 1
            pod = self.pods.get(uid)
            if pod is None or not self.still_waits(pod, self.states[uid]):
                self.kick(uid)

    def stop(self, state: PodState) -> None:
        """The pod waits no more: booked (the capacity may hold the next
        alike pod too), or deleted, ended, given up (it hands its turn on)."""
        shape = state.waiting_shape
        state.waiting_since, state.waiting_shape = None, None
        if shape is not None:
            self._kick_heads({shape})
