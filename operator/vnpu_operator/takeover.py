"""What a replica that starts reconciling (a new leader, or a restart once
synced) releases before it places anything new.

While no replica led, tenants went on: pods were deleted and others created.
A ResourceQuota stops counting a pod once its containers are known stopped
(terminal phase, or deleted with grace 0: exactly when the operator may
release its vNPUs), so the webhook admitted the new pods against quota the old
ones no longer held, but whose vNPUs still exist. Reconciling everything in
UID order then created some new vNPUs before destroying the old: a namespace
whose quota allows 10 vNPUs was seen holding 18 (issue 58).

So a namespace's placements wait while the allocations due for release when
reconciling began are still there: each one's agent destroys the vNPU and
removes the finalizer, and the allocation's deletion is what lifts the wait.
Other namespaces place at once. The wait has a bound: an agent may defer a
destroy while a process holds the device open, and placing must not stop
behind it for longer than a takeover is allowed to take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# How long placements in a namespace wait behind its releases at most. A
# release takes an agent a few hundred milliseconds; the failover goal is 5 s
# to the next placement.
BOUND_SECONDS = 5.0


class ReleaseFirst:
    """Per namespace, the allocation keys due for release when reconciling
    began, and the pods whose placement waits for them."""

    def __init__(self, clock: Callable[[], float], bound: float = BOUND_SECONDS) -> None:
        self.clock = clock
        self.bound = bound
        self._due: dict[str, set[str]] = {}
        self._held: dict[str, set[str]] = {}
        self._until = 0.0

    def start(self, due: Iterable[str]) -> None:
        """Reconciling begins; `due`: the keys (namespace/name) of every
        allocation whose release is due now. Replaces whatever an earlier
        start left."""
        self._due, self._held = {}, {}
        for key in due:
            self._due.setdefault(key.partition("/")[0], set()).add(key)
        self._until = self.clock() + self.bound

    @property
    def active(self) -> bool:
        return bool(self._due)

    def holds(self, namespace: str, uid: str) -> bool:
        """Whether the pod `uid` of `namespace` must not be placed yet; if
        so, it is kicked when the wait ends (`gone`, `expire`)."""
        if namespace not in self._due:
            return False
        if self.clock() >= self._until:
            return False
        self._held.setdefault(namespace, set()).add(uid)
        return True

    def gone(self, key: str) -> set[str]:
        """An allocation is gone: the pods to kick, if that was the last of
        its namespace's releases."""
        namespace = key.partition("/")[0]
        keys = self._due.get(namespace)
        if keys is None or key not in keys:
            return set()
        keys.discard(key)
        if keys:
            return set()
        del self._due[namespace]
        return self._held.pop(namespace, set())

    def expire(self) -> set[str]:
        """The bound passed: every held pod, to kick; nothing waits any more."""
        held = set().union(*self._held.values()) if self._held else set()
        self._due, self._held = {}, {}
        return held

    def stop(self) -> None:
        """This replica stopped reconciling."""
        self._due, self._held = {}, {}
