"""What the server holds of one node's VNPUNode, as far as its agent knows:
the VNPUNode watch's latest event and the answers to the agent's own writes.

The agent restores a VNPUNode someone else changed or removed, so it must
tell a foreign change from a late event. A watch delivers events in order, so
every event before the echo of our latest write (the event carrying the
resourceVersion our write was answered with) is older than that write, however
late it arrives: on a loaded API server the watch runs seconds behind the
answers. Until the echo is in, a difference proves nothing; only resourceVersion
equality is used, which Kubernetes allows clients to rely on. A (re-)list
gives the newest state only, so the echo of a write before it never comes: a
listed object ends the wait. A bound of minutes is the safety net.
A write that changed nothing is answered with the object's current
resourceVersion and has no echo of its own: if the watch already delivered that
version, there is nothing to wait for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vnpu_common.wire import names
from vnpu_common.wire.types import Raw

# After this long without the echo of our last write, the VNPUNode is
# compared anyway. The echo is not expected to be lost (a resumed watch
# replays every event since the last one seen, a re-list ends the wait), so
# this is a safety net, and it must outlast the watch's lag on an overloaded
# server: at 1000 nodes on 2 cores, the API server closed the agents' watches
# as unresponsive and the resumed watches ran almost 4 minutes behind.
ECHO_WAIT_SECONDS = 600.0


def _rv(obj: Raw) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return rv if isinstance(rv, str) else None


@dataclass
class NodeMirror:
    node: str
    # The VNPUNode, or None once it is gone (or lost its label); nothing is
    # known before the watch's first list.
    observed: Raw | None = None
    known: bool = False
    # The status the server answered our last write with.
    published: dict[str, Any] | None = None
    # The resourceVersion our last write was answered with.
    written_rv: str | None = None
    # The same until the watch delivers it.
    echo_rv: str | None = None
    echo_since: float = 0.0
    # The resourceVersion of the watch's latest event: a write that changed
    # nothing is answered with the object's current one and has no echo.
    last_rv: str | None = None
    # Our writes that failed since the last that succeeded: the server may
    # hold such a write or not (a 504 is often applied), so a difference is
    # no one else's until a write succeeds.
    failures: int = 0
    # The resourceVersions of the events the watch delivered while a write
    # was in flight (its echo may come before its answer); None while no
    # write is.
    _seen_in_write: list[str | None] | None = field(default=None, repr=False)

    def on_event(self, kind: str, obj: Raw) -> None:
        """An event of the VNPUNode watch (DELETED also when the object lost
        the label the watch selects on)."""
        self.observed = None if kind == "DELETED" else obj
        self.known = True
        rv = self.last_rv = _rv(obj)
        if kind == "SYNC" or (rv is not None and rv == self.echo_rv):
            # A (re-)list shows the newest state only: an echo older than it
            # never comes.
            self.echo_rv = None
        if self._seen_in_write is not None:
            self._seen_in_write.append(rv)

    def write_started(self) -> None:
        self._seen_in_write = []

    def write_failed(self) -> None:
        self._seen_in_write = None
        self.failures += 1

    def write_answered(self, obj: Raw, now: float) -> None:
        seen = self._seen_in_write or []
        self._seen_in_write = None
        self.failures = 0
        self.published = obj.get("status")
        rv = self.written_rv = _rv(obj)
        self.echo_rv = None if rv is None or rv in seen or rv == self.last_rv else rv
        self.echo_since = now
        if not self.labelled(obj):
            # Someone took the label off before our write landed: the watch
            # selects on the label, so this write has no echo, and the answer
            # is the newest state the watch will ever show of it.
            self.echo_rv = None
            self.observed, self.known = obj, True
            return
        if not seen:
            # The answer is the newest state we know of, unless the watch said
            # something meanwhile: that may be newer (a deletion right after).
            self.observed, self.known = obj, True

    def echo_pending(self, now: float) -> bool:
        """Whether the watch may still be behind our last write."""
        return self.echo_rv is not None and now - self.echo_since < ECHO_WAIT_SECONDS

    def labelled(self, obj: Raw) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return bool(labels.get(names.LABEL_NODE) == self.node)

    def missing(self) -> bool:
        """The watch said the VNPUNode is gone: a write must create it."""
        return self.known and self.observed is None

    def needs_restore_write(self) -> bool:
        """The next write must create the VNPUNode or put its label back."""
        return self.missing() or (self.observed is not None and not self.labelled(self.observed))

    def differs(self) -> str | None:
        """How the VNPUNode the server holds differs from our last write, or
        None. Before our first write nothing differs: that write comes anyway."""
        if self.published is None or not self.known:
            return None
        if self.observed is None:
            return "deleted"
        if not self.labelled(self.observed):
            return "unlabelled"
        if self.observed.get("status") != self.published:
            return "status"
        return None
