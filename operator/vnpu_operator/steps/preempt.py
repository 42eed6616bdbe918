"""Preemption, the controller's side: when a waiting pod may evict others,
the evictions, the claim on the node, and what everyone is told.

Only with `--preemption`. The placer calls `after_nofit` when a pod did not
fit; the plan is placement.preemption's. Its victims are first evicted as a
dry run, all of them, so that a PodDisruptionBudget refusing one means none
is evicted; then the claim is booked in the ledger and written to the pod as
`status.nominatedNodeName` (what a restarted operator rebuilds it from,
`restore`), and only then are the victims evicted for real.

The claim holds while something on its node is still releasing: one of its
victims still holds vNPUs there, or a pod there is terminating (after a
restart the claim knows no victims, but their deletion is in the objects).
If the pod still does not fit once nothing is releasing, the claim is stale:
it is dropped and the pod plans again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from vnpu_common.kube.informer import key_of
from vnpu_common.kube.rawcall import describe
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.config import OperatorSettings
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.lifecycle import is_deleting, is_gated, is_terminal
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.notices import Notices
from vnpu_operator.placement import InvalidRequestError, Ledger, NoFit, PodRequest
from vnpu_operator.placement.nominations import Nomination
from vnpu_operator.placement.preemption import Candidate, Plan, plan, worth_trying
from vnpu_operator.podstate import PodState
from vnpu_operator.timers import KickTimers

# The logger keeps its name from before the move into steps/: log lines read as before.
log = logging.getLogger("vnpu_operator.preempting")

# A pod a PodDisruptionBudget kept from preempting tries again after this,
# doubling per refusal in a row (budgets are not watched: a replica becoming
# ready is seen only by asking again), and whenever capacity changes.
RETRY_BASE_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0
# Plans checked by a dry run per attempt: each refusal protects one more pod,
# and the ledger may move while a dry run is on the wire.
MAX_ROUNDS = 8


def priority(pod: Mapping[str, Any]) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def never_preempts(pod: Mapping[str, Any]) -> bool:
    return (pod.get("spec") or {}).get("preemptionPolicy") == "Never"


def nominated_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("nominatedNodeName") or "")


def recorded_node(pod: Mapping[str, Any]) -> str:
    """The node the operator wrote in vnpu.io/nominated-node with the
    nomination (kubeapi.set_nominated_node)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(names.ANN_NOMINATED_NODE) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else ""


def restorable_claim(pod: Mapping[str, Any]) -> str:
    """The node of the claim an earlier run of the operator made for this
    pod, or "". Only a nomination the operator recorded counts: anybody with
    pods/status (a tenant where the protection policies are off, an exempt
    admin) can write status.nominatedNodeName, and a claim restored from it
    would hold capacity for a pod that evicted nobody."""
    node = nominated_node(pod)
    if not node or node != recorded_node(pod) or not is_gated(pod):
        return ""
    return "" if is_deleting(pod) or is_terminal(pod) else node


def foreign_nomination(pod: Mapping[str, Any], *, preempting: bool) -> str:
    """status.nominatedNodeName of a gated pod that this operator did not
    write, or "". The scheduler never nominates a gated pod, and the
    operator only with preemption on (`preempting`) and with its record:
    any other nomination is forged, and the scheduler would keep the
    pod's charges free on that node for it, refusing pods the operator
    placed there."""
    node = nominated_node(pod)
    if not node or not is_gated(pod) or is_deleting(pod):
        return ""
    return node if not preempting or node != recorded_node(pod) else ""


class Preemption:
    def __init__(
        self,
        api: OperatorApi,
        notices: Notices,
        ledger: Ledger,
        settings: OperatorSettings,
        metrics: OperatorMetrics,
        *,
        pods: Mapping[str, Raw],
        allocs: Mapping[str, Raw],
        clock: Callable[[], float],
        kick: Callable[[str], None] = lambda _uid: None,
        grew: Callable[[], None] = lambda: None,
    ) -> None:
        """`pods`, `allocs`: the controller's caches (by uid, by key);
        `kick`: reconcile a pod; `grew`: capacity may have grown (a claim
        dropped), so waiting pods are retried."""
        self.api = api
        self.notices = notices
        self.ledger = ledger
        self.settings = settings
        self.metrics = metrics
        self.pods = pods
        self.allocs = allocs
        self.kick = kick
        self.grew = grew
        self.clock = clock
        # Kicks a pod when its backoff ends.
        self._timers = KickTimers(lambda uid: self.kick(uid))

    @property
    def enabled(self) -> bool:
        return self.settings.preemption

    # ------------------------------------------------------------ claims

    def restore(self, pod: Raw) -> None:
        """A pod this operator sees for the first time (after a restart)
        carrying the claim an earlier run wrote (`restorable_claim`): booked
        again, before any placement runs. A pod holding allocations was
        placed: its claim is dropped at its first reconcile (`release_claim`)."""
        node = restorable_claim(pod)
        if not (self.enabled and node):
            return
        try:
            request = PodRequest.from_pod(pod)
        except InvalidRequestError:
            return
        if self.ledger.nomination(request.uid) is None:
            self.ledger.nominate(request, node)
            log.info("pod %s: claim on node %s restored", key_of(pod), node)

    async def clear_foreign(self, pod: Raw) -> None:
        """A forged nomination of a gated pod (`foreign_nomination`) is
        cleared, or put back to the pod's own claim if it has one; one write,
        and only when there is one. The cached copy is cleared at once, so
        that the rest of the reconcile does not clear it again."""
        node = foreign_nomination(pod, preempting=self.enabled)
        if not node:
            return
        uid = str(pod["metadata"].get("uid", ""))
        claim = self.ledger.nomination(uid)
        ours = claim.node if claim is not None else None
        log.warning(
            "pod %s: status.nominatedNodeName %s was not written by the vnpu-operator; %s",
            key_of(pod), node, f"set back to {ours}" if ours else "cleared",
        )  # fmt: skip
        await self.api.set_nominated_node(pod, ours)
        # A new status, not the cached one changed: equal parts of cached
        # copies are one object (slim.Alike).
        status = {k: v for k, v in (pod.get("status") or {}).items() if k != "nominatedNodeName"}
        if ours:
            status["nominatedNodeName"] = ours
        pod["status"] = status

    def forget(self, uid: str) -> None:
        """Drops the pod's claim, if any; what it held is free to others."""
        if self.ledger.clear_nomination(uid) is not None:
            self.grew()

    async def release_claim(self, pod: Raw, state: PodState) -> None:
        """The pod is placed, given up on or going: no claim any more, and
        its status no longer names the node. The scheduler nominates only
        pods it schedules, never gated ones: a gated pod's is ours (maybe
        from before a restart), an ungated one's only if we wrote it."""
        uid = str(pod["metadata"].get("uid", ""))
        ours = self.ledger.nomination(uid) is not None or state.nominated or is_gated(pod)
        self.forget(uid)
        # What we wrote may not have reached the cache yet: state.nominated says.
        if ours and (nominated_node(pod) or state.nominated) and not is_deleting(pod):
            await self.api.set_nominated_node(pod, None)
        state.nominated = ""

    def _releasing(self, node: str) -> set[str]:
        """Pods whose vNPUs on `node` are on their way out."""
        out: set[str] = set()
        for alloc in self.ledger.allocations_on(node):
            pod = self.pods.get(alloc.pod_uid)
            obj = self.allocs.get(alloc.key) or {}
            if (
                pod is None
                or is_deleting(pod)
                or is_terminal(pod)
                or (obj.get("metadata") or {}).get("deletionTimestamp")
            ):
                namespace = alloc.key.partition("/")[0]
                out.add(key_of(pod) if pod is not None else f"{namespace}/{alloc.pod_name}")
        return out

    def _waiting_on(self, claim: Nomination) -> list[str]:
        """Whom the claim waits for; empty when it is stale (or its node is
        not live: nothing will free there until its agent is back)."""
        inventory = self.ledger.node(claim.node)
        if inventory is None or not inventory.live:
            return []
        waiting = self._releasing(claim.node)
        for uid in claim.victims:
            for alloc in self.ledger.allocations_for(uid):
                pod = self.pods.get(uid)
                namespace = alloc.key.partition("/")[0]
                waiting.add(key_of(pod) if pod is not None else f"{namespace}/{alloc.pod_name}")
        return sorted(waiting)

    # ------------------------------------------------------------ preempting

    async def after_nofit(
        self, pod: Raw, state: PodState, request: PodRequest, nofit: NoFit
    ) -> bool:
        """The pod did not fit. True when it was told why it waits here
        (preempting, or kept from it by a budget), False when the plain
        waiting notice applies."""
        if not self.enabled:
            return False
        claim = self.ledger.nomination(request.uid)
        if claim is not None:
            waiting_on = self._waiting_on(claim)
            if waiting_on:
                await self.notices.tell(
                    pod, state, names.REASON_PREEMPTING,
                    f"waiting on node {claim.node} for preempted pod(s) "
                    f"{', '.join(waiting_on)} to release their vNPUs",
                    condition=True, event_key=claim.node,
                )  # fmt: skip
                return True
            log.info("pod %s: claim on node %s is stale; planning again", request.key, claim.node)
            self.forget(request.uid)
        holds = bool(self.ledger.allocations_for(request.uid))
        if never_preempts(pod) or holds or not worth_trying(nofit):
            await self._unclaimed(pod, state)
            return False
        wait = state.preempt_not_before - self.clock()
        if wait > 0:
            # Its kick may have been lost (dropped while this replica was not
            # leading, say) or may have come a little early: without a timer
            # the pod would wait for a capacity change that may never come.
            if not self._timers.armed(request.uid):
                self._timers.arm(request.uid, wait)
            return bool(state.protected)
        state.protected.clear()
        try:
            chosen = await self._checked_plan(request, state)
        except Exception as exc:
            # A dry run failed (no RBAC for evictions, say): the pod waits as
            # any other, and preemption is tried again after a backoff.
            self._failed(request, state, exc)
            return False
        if chosen is None:
            if state.protected:
                await self._blocked(pod, state, nofit)
                return True
            state.preempt_refusals = 0
            await self._unclaimed(pod, state)
            return False
        return await self._preempt(pod, state, request, nofit, chosen)

    def _candidates(self) -> dict[str, Candidate]:
        """Every pod holding vNPUs; one the cache no longer has is going."""
        out: dict[str, Candidate] = {}
        for alloc in self.ledger.allocations():
            if alloc.pod_uid in out:
                continue
            pod = self.pods.get(alloc.pod_uid)
            if pod is None:
                out[alloc.pod_uid] = Candidate(alloc.pod_uid, alloc.key, 0, terminating=True)
                continue
            going = is_deleting(pod) or is_terminal(pod)
            out[alloc.pod_uid] = Candidate(alloc.pod_uid, key_of(pod), priority(pod), going)
        return out

    async def _checked_plan(self, request: PodRequest, state: PodState) -> Plan | None:
        """A plan whose every eviction a dry run allowed, computed anew after
        the last await, so that the caller books it before anything moves."""
        checked: Plan | None = None
        for _ in range(MAX_ROUNDS):
            found = plan(
                self.ledger, request, self._candidates(), self.settings.placement_policy,
                protected=state.protected, avoid=state.avoid,
            )  # fmt: skip
            if found is None or found == checked:
                return found
            refused = await self._dry_run(found)
            state.protected.update(refused)
            checked = None if refused else found
        return None

    async def _dry_run(self, chosen: Plan) -> dict[str, str]:
        """uid -> why, for each victim a PodDisruptionBudget would not let go."""
        refused: dict[str, str] = {}
        for victim in chosen.victims:
            pod = self.pods.get(victim.uid)
            if pod is None:
                continue
            why = await self.api.evict_pod(pod, dry_run=True)
            if why is not None:
                refused[victim.uid] = f"{victim.key} ({why})"
        return refused

    async def _preempt(
        self, pod: Raw, state: PodState, request: PodRequest, nofit: NoFit, chosen: Plan
    ) -> bool:
        node = chosen.node
        # Claimed before the first eviction, and written where a restarted
        # operator finds it: the capacity freed is never up for grabs.
        self.ledger.nominate(request, node, {v.uid for v in chosen.victims})
        try:
            written = await self.api.set_nominated_node(pod, node)
        except Exception:
            self.forget(request.uid)
            raise
        if not written:
            # The pod is gone: nobody to make room for. Its claim held nothing
            # yet, so waiting pods need no retry (which would plan for it again).
            self.ledger.clear_nomination(request.uid)
            return True
        state.nominated = node
        evicted: list[Candidate] = []
        failure: Exception | None = None
        for victim in chosen.victims:
            target = self.pods.get(victim.uid)
            if target is None:
                evicted.append(victim)  # gone already: its vNPUs are being released
                continue
            try:
                why = await self.api.evict_pod(target)
            except Exception as exc:
                failure = failure or exc
                continue
            if why is not None:
                # Allowed by the dry run a moment ago, refused now.
                state.protected[victim.uid] = f"{victim.key} ({why})"
                continue
            evicted.append(victim)
            self.metrics.preemption_victims.inc()
            await self.notices.preempted(target, request.key, request.priority, node)
        if evicted:
            self.ledger.nominate(request, node, {v.uid for v in evicted})
            state.preempt_refusals = 0
            state.preempt_not_before = 0.0
            who = ", ".join(v.key for v in evicted)
            log.info("pod %s: preempted %s on node %s", request.key, who, node)
            self.metrics.preemption_attempts.labels("evicted").inc()
            await self.notices.tell(
                pod, state, names.REASON_PREEMPTING,
                f"preempted {who} (priority below {request.priority}) on node {node}; "
                "waiting there for their vNPUs to be released",
                condition=True, event_key=node,
            )  # fmt: skip
        else:
            # It held nothing yet: no retry of waiting pods (which would plan
            # for this one again at once).
            self.ledger.clear_nomination(request.uid)
            await self._unclaimed(pod, state)
            if state.protected:
                await self._blocked(pod, state, nofit)
        if failure is not None:
            self._failed(request, state, failure)
        return bool(evicted or state.protected)

    def _failed(self, request: PodRequest, state: PodState, exc: Exception) -> None:
        """An eviction call failed: counted, logged, tried again after the
        same backoff as a budget's refusal (never at once, never in a loop)."""
        self.metrics.preemption_attempts.labels("failed").inc()
        state.preempt_refusals += 1
        delay = self._backoff(request.uid, state)
        log.warning(
            "pod %s: preemption failed (%s); trying again in %.0fs",
            request.key, describe(exc), delay,
        )  # fmt: skip

    def _backoff(self, uid: str, state: PodState) -> float:
        """Waits `state.preempt_refusals` doublings, then kicks the pod."""
        doublings = max(state.preempt_refusals - 1, 0)
        delay = min(RETRY_BASE_SECONDS * 2.0**doublings, RETRY_MAX_SECONDS)
        state.preempt_not_before = self.clock() + delay
        self._timers.arm(uid, delay)
        return delay

    async def _blocked(self, pod: Raw, state: PodState, nofit: NoFit) -> None:
        state.preempt_refusals += 1
        delay = self._backoff(str(pod["metadata"].get("uid", "")), state)
        self.metrics.preemption_attempts.labels("blocked").inc()
        protected = "; ".join(state.protected[u] for u in sorted(state.protected))
        await self._unclaimed(pod, state)
        await self.notices.tell(
            pod, state, names.REASON_PREEMPTION_BLOCKED,
            f"{nofit.message}; preemption would evict {protected}: a PodDisruptionBudget "
            f"forbids it; trying again in {delay:.0f}s or when capacity changes",
            condition=True, warning=True, event_key=",".join(sorted(state.protected)),
        )  # fmt: skip

    async def _unclaimed(self, pod: Raw, state: PodState) -> None:
        """No claim: a status that still names a node (ours, from before a
        restart or a stale claim) is cleared."""
        if self.ledger.nomination(str(pod["metadata"].get("uid", ""))) is None and (
            state.nominated or nominated_node(pod)
        ):
            await self.api.set_nominated_node(pod, None)
            state.nominated = ""
