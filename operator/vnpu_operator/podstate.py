"""What the operator remembers about a pod between reconciles, in one record,
and the writes it has sent whose effect its caches have not shown yet.

Everything else the operator knows is in the objects themselves (the pod,
its allocations, the ledger built from them), so a restarted operator that
starts with empty records behaves correctly: at worst it repeats an Event or
measures a latency from a later start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from enum import Enum


@dataclass
class PodState:
    """One pod's memory, dropped when the pod and its allocations are gone."""

    # When the operator first saw the pod: allocation latency starts here.
    seen_at: float
    # When it started to wait for capacity (None: not waiting); waiting pods
    # are retried oldest first when capacity grows.
    waiting_since: float | None = None
    # Why it waits: the placement's primary reason code (a metric label).
    waiting_reason: str = ""
    # What its placement reads of its request (NoFitMemo.signature), None
    # for one placed afresh each time: alike waiting pods are retried one at
    # a time, oldest first, the next as soon as one is booked.
    waiting_shape: Hashable | None = None
    # Placements whose vNPUs failed, and the nodes where they did.
    attempts: int = 0
    avoid: set[str] = field(default_factory=set)
    # The last Event said (reason and what it was about) and the message of
    # the condition last set, so a pod is not re-told the same thing.
    announced: str = ""
    condition: str = ""
    # When the pod was deleted or ended: release latency starts here.
    releasing_since: float | None = None
    # Allocations of the pod that disappeared without the operator deleting
    # them (key -> the vNPU it held, for the message), and those whose loss
    # the pod has been told of.
    vanished: dict[str, str] = field(default_factory=dict)
    lost_told: set[str] = field(default_factory=set)
    # Allocations of the pod that no agent will ever serve, already reported.
    unservable: set[str] = field(default_factory=set)
    # Hand edits of the pod already reported.
    hand_edits: set[str] = field(default_factory=set)
    # Preemption: uid -> namespace/name of the pods a PodDisruptionBudget
    # kept it from evicting, how many times in a row it was refused, and the
    # clock before which it does not try again.
    protected: dict[str, str] = field(default_factory=dict)
    preempt_refusals: int = 0
    preempt_not_before: float = 0.0
    # The node this operator last wrote as the pod's status.nominatedNodeName.
    nominated: str = ""
    # Consecutive failed writes of the pod's allocations (Notices.write_failed).
    write_failures: int = 0
    # Partial placements given back because they could not be completed on
    # their node (Placer.give_back); like `attempts`, each one moves the
    # names of the pod's next allocations on.
    given_back: int = 0

    @property
    def told(self) -> bool:
        return bool(self.announced or self.condition)


class Write(Enum):
    """Writes whose effect the watch has yet to deliver (what Kubernetes'
    own controllers call expectations). Until it arrives the cache is stale
    in a known way, and acting on it again would repeat the write."""

    # An allocation created; keyed by allocation key.
    CREATE = "create"
    # An allocation deleted by the operator: a release it asked for, not a
    # loss; kept until the object is gone. Keyed by allocation key.
    DELETE = "delete"
    # A pod's pin patch (which also ungates it); keyed by pod UID.
    UNGATE = "ungate"
    # A pod's finalizer removal; keyed by pod UID.
    UNFINALIZE = "unfinalize"


class Expectations:
    def __init__(self) -> None:
        self._sent: dict[Write, set[str]] = {write: set() for write in Write}

    def sent(self, write: Write, key: str) -> None:
        self._sent[write].add(key)

    def pending(self, write: Write, key: str) -> bool:
        return key in self._sent[write]

    def seen(self, write: Write, key: str) -> None:
        """The cache now shows the write's effect (or it no longer matters)."""
        self._sent[write].discard(key)

    async def sending(self, write: Write, key: str, call: Callable[[], Awaitable[object]]) -> None:
        """`call()` with `key` expected from before it is sent: the write's
        effect can reach the watch before its answer reaches us. A finalizer
        removal that deletes the pod was reported DELETED, our finalizer still
        in the event's content, in the middle of the call about one time in
        six; expected only after it, the pod read as unlabelled and was
        relabelled (a 404), and the expectation outlived the pod."""
        self.sent(write, key)
        try:
            await call()
        except BaseException:
            self.seen(write, key)
            raise

    def keys(self, write: Write) -> frozenset[str]:
        return frozenset(self._sent[write])

    async def send_unsent(
        self, write: Write, keys: Sequence[str], call: Callable[[str], Awaitable[object]]
    ) -> None:
        """`send_all` for the keys not sent already (their effect is on its way)."""
        await self.send_all(write, [key for key in keys if not self.pending(write, key)], call)

    async def send_all(
        self, write: Write, keys: Sequence[str], call: Callable[[str], Awaitable[object]]
    ) -> None:
        """`call(key)` for every key at once, each that succeeds expected.
        A pod's four allocations written one after another cost four round
        trips of a loaded API server before the pod (or the pod waiting for
        the capacity) can go on; written together, about one. The first
        failure is raised once every call has answered, so no success goes
        unrecorded."""
        outcomes = await asyncio.gather(*(call(key) for key in keys), return_exceptions=True)
        for key, outcome in zip(keys, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                self.sent(write, key)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]
