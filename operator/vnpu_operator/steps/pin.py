"""The PIN step: once every allocation of a pod is Ready, the one patch that
pins it to its node, publishes its device ids and removes our scheduling
gate (the patch itself is `pinning.pin_patch`'s), then the pod is told."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.informer import key_of
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.leaving import Leaving
from vnpu_operator.lifecycle import Step
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.notices import TELL_AFTER_FAILURES, Notices
from vnpu_operator.pinning import PinningError, pin_patch
from vnpu_operator.placement import Ledger
from vnpu_operator.podstate import Expectations, PodState, Write
from vnpu_operator.timers import KickTimers

# A pod held back for pods leaving its node is told so only once the hold has
# lasted this long (seconds): most holds end within a fraction of a second, when
# our own finalizer write for the leaving pod lands, and two writes per held pod
# (condition, Event) would only add to the API server's load at that moment.
TELL_HELD_AFTER = 1.0

# The logger keeps the name it had in the controller: log lines read as before.
log = logging.getLogger("vnpu_operator.controller")


class Pinner:
    def __init__(
        self,
        api: OperatorApi,
        notices: Notices,
        ledger: Ledger,
        expect: Expectations,
        metrics: OperatorMetrics,
        leaving: Leaving,
        *,
        labels: Callable[[str], Mapping[str, str]],
        clock: Callable[[], float],
    ) -> None:
        """`labels(node)`: the node's labels as cached (inventories)."""
        self.api = api
        self.leaving = leaving
        self.notices = notices
        self.ledger = ledger
        self.expect = expect
        self.metrics = metrics
        self.labels = labels
        self.clock = clock
        # Reconciles a pod (the controller's kick; set by the wiring).
        self.kick: Callable[[str], None] = lambda _uid: None
        # Reconciles a held pod when it is due to be told.
        self.timers = KickTimers(lambda uid: self.kick(uid))

    async def pin(self, uid: str, pod: Raw, state: PodState, step: Step) -> None:
        if self.expect.pending(Write.UNGATE, uid):
            return  # patched already; the cache has not seen the ungated pod yet
        allocs = [self.ledger.allocation(k) for k in step.keys]
        ids = [a.vnpu_id for a in allocs if a is not None]
        node = step.node
        now = self.clock()
        if blockers := self.leaving.blocking(uid, node, now):
            waited = self.leaving.held_for(uid, now)
            if waited >= TELL_HELD_AFTER:
                await self._hold(pod, state, ids, node, blockers)
            elif not self.timers.armed(uid):
                self.timers.arm(uid, TELL_HELD_AFTER - waited)
            return
        self.timers.cancel(uid)
        try:
            ops = pin_patch(pod, node, self.labels(node), ids)
        except PinningError as exc:
            await self.notices.tell(
                pod, state, names.REASON_PINNING_FAILED, str(exc), condition=True, warning=True
            )
            return
        meta = pod["metadata"]
        try:
            await self.api.patch_pod(meta["namespace"], meta["name"], ops)
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                # The pod changed under us (a newer version is on its way to
                # the cache) or is gone; the next event reconciles again.
                log.info(
                    "pod %s: pin patch refused (%s); waiting for a newer pod",
                    key_of(pod),
                    exc.status,
                )
                return
            state.write_failures += 1
            if state.write_failures >= TELL_AFTER_FAILURES:
                what = f"pin it to node {node} and remove its scheduling gate"
                await self.notices.write_failed(pod, state, what, exc)
            raise
        state.write_failures = 0
        self.expect.sent(Write.UNGATE, uid)
        # Losses told before are of earlier placements' allocations.
        state.vanished.clear()
        state.lost_told.clear()
        self.metrics.allocation_latency.observe(self.clock() - state.seen_at)
        templates = sorted({a.template for a in allocs if a is not None})
        await self.notices.ready(pod, state, ids, templates, node)

    async def _hold(
        self, pod: Raw, state: PodState, ids: list[int], node: str, blockers: list[Raw]
    ) -> None:
        who = ", ".join(key_of(p) for p in blockers[:3])
        if len(blockers) > 3:
            who += f" and {len(blockers) - 3} more"
        devices = ",".join(str(i) for i in ids)
        await self.notices.tell(
            pod, state, names.REASON_WAITING_FOR_LEAVING,
            f"vNPU {devices} ready on node {node}; ungated once {who} is gone: "
            "kube-scheduler counts a pod's vNPU requests on its node until the pod "
            "object is deleted",
            condition=True, event_key=node,
        )  # fmt: skip
