"""Leader election over a coordination.k8s.io Lease, as rules: what this
replica writes to the Lease next, and until when it may write anything else.

No event loop and no client (the runner, `leader.py`, reads and writes the
Lease and arms the timers), so each rule is tested with plain numbers.

The rules are client-go's (leaderelection), with one addition:
- A replica takes the Lease when nobody holds it, when it holds it already
  (a restarted container of the same pod), or when its holder has not
  renewed for `lease_seconds` as this replica observed it: the time counted
  is this replica's monotonic clock since it saw the Lease's
  resourceVersion change, never the renewTime written in it, so clocks that
  disagree between nodes cannot shorten a lease.
- Every write carries the resourceVersion last read (the API server answers
  409 to a write over a Lease someone else changed meanwhile): of two
  replicas that both found the Lease expired, one wins.
- The fence (the addition): a leader may write, and believes it leads, only
  until `renew_deadline` after it *sent* its last successful renewal. A
  follower cannot take the Lease before `lease_seconds` after it saw that
  renewal, which is later than the leader sent it; so the old leader has
  stopped writing `lease_seconds - renew_deadline` before anyone else can
  start, however long its process was frozen (SIGSTOP, a stalled node): the
  monotonic clock runs on meanwhile, and every write asks `may_write` just
  before it is sent.
- A leader within its deadline renews with a JSON patch that first tests
  that it still holds the Lease, not with the resourceVersion it read: the
  API server applies the test and the renewal to the stored Lease at once,
  so renewals need not wait for each other's answers. Up to
  `Timing.renewals_in_flight` are sent `retry_seconds` apart while earlier
  ones are unanswered, and each success extends the lead to its own send
  plus the deadline. One at a time, an API server answering in L seconds
  cost the lead whenever two answers in a row took L + retry + L > the
  deadline (1.25 s each with the defaults); overlapped, only when L nears
  the deadline itself. The proof above holds for each renewal alone: it
  landed after it was sent, with this replica the holder.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from vnpu_common.wire.types import Raw


@dataclass(frozen=True)
class Timing:
    """Seconds: a Lease outlives its last renewal by `lease_seconds`; the
    leader renews every `retry_seconds` and stops writing `renew_deadline`
    after the last renewal it sent that succeeded; a follower tries every
    `retry_seconds` too."""

    lease_seconds: int = 4
    renew_deadline: float = 3.0
    retry_seconds: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < retry < renew deadline < lease duration, not "
                f"{self.retry_seconds:g} < {self.renew_deadline:g} < {self.lease_seconds}"
            )

    @property
    def least_lead(self) -> float:
        """The least time left of a lead for a replica that does not lead to
        start leading: a third of the deadline (an answer within two thirds
        of it)."""
        return self.renew_deadline / 3

    @property
    def connections(self) -> int:
        """The connections the election's client needs: one per renewal in
        flight, one more for a read."""
        return self.renewals_in_flight + 1

    @property
    def renewals_in_flight(self) -> int:
        """How many renewals a leader may have unanswered: one per retry
        within the deadline (a renewal unanswered after the deadline is given
        up), at most 6."""
        return max(1, min(6, math.ceil(self.renew_deadline / self.retry_seconds)))


@dataclass(frozen=True)
class Record:
    """What the election reads of a Lease."""

    holder: str
    lease_seconds: int
    transitions: int
    acquired: str
    version: str

    @classmethod
    def from_api(cls, lease: Raw) -> Record:
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        duration = spec.get("leaseDurationSeconds")
        transitions = spec.get("leaseTransitions")
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_seconds=duration if isinstance(duration, int) and duration > 0 else 0,
            transitions=transitions if isinstance(transitions, int) else 0,
            acquired=str(spec.get("acquireTime") or ""),
            version=str(meta.get("resourceVersion") or ""),
        )


def micro_time(epoch: float) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, UTC."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Election:
    """One replica's view of the Lease. `now` arguments are monotonic
    seconds; `wall` arguments epoch seconds (only written, never compared)."""

    identity: str
    timing: Timing = field(default_factory=Timing)
    observed: Record | None = None
    # Monotonic time this replica saw `observed` (its resourceVersion) first.
    observed_at: float = 0.0
    # Monotonic time after which this replica must not write.
    leading_until: float = float("-inf")

    # ------------------------------------------------------------ reading

    def may_write(self, now: float) -> bool:
        """The fence: whether this replica leads and its last renewal is
        recent enough that nobody else can have taken the Lease."""
        return now < self.leading_until

    def holder(self) -> str:
        return self.observed.holder if self.observed is not None else ""

    def observe(self, record: Record | None, now: float) -> None:
        """The Lease as just read (None: there is none)."""
        if record is None:
            self.observed = None
        elif self.observed is None or record.version != self.observed.version:
            self.observed, self.observed_at = record, now
        if self.holder() != self.identity:
            self.leading_until = float("-inf")

    def expired(self, now: float) -> bool:
        """Whether the observed holder has let the Lease run out."""
        record = self.observed
        if record is None or not record.holder:
            return True
        return now >= self.observed_at + max(record.lease_seconds, 1)

    # ------------------------------------------------------------ writing

    def wants(self, now: float) -> bool:
        """Whether a write now could make or keep this replica the leader."""
        return self.holder() == self.identity or self.expired(now)

    def body(self, name: str, namespace: str, wall: float) -> dict[str, Any]:
        """The Lease to write: a renewal if this replica holds it, else a
        take-over (a new acquireTime, one more transition). Carries the
        observed resourceVersion (absent for a create)."""
        record = self.observed
        ours = record is not None and record.holder == self.identity
        stamp = micro_time(wall)
        transitions = record.transitions if record is not None else 0
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if record is not None:
            meta["resourceVersion"] = record.version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.timing.lease_seconds,
                "acquireTime": record.acquired if ours and record is not None else stamp,
                "renewTime": stamp,
                "leaseTransitions": transitions if ours or record is None else transitions + 1,
            },
        }

    def release_patch(self, wall: float) -> list[dict[str, Any]] | None:
        """The Lease handed back on a clean stop, as a JSON patch (no holder,
        so a standby takes it at its next try instead of after the lease
        duration; refused unless this replica still holds it, whatever
        renewals landed last); None when this replica does not hold it."""
        record = self.observed
        if record is None or record.holder != self.identity:
            return None
        return self._held_patch(wall, holderIdentity="", leaseDurationSeconds=1)

    def renewal(self, wall: float) -> list[dict[str, Any]]:
        """The leader's renewal as a JSON patch: refused by the API server
        (the test fails) unless this replica still holds the Lease."""
        return self._held_patch(wall, leaseDurationSeconds=self.timing.lease_seconds)

    def _held_patch(self, wall: float, **spec: Any) -> list[dict[str, Any]]:
        """A JSON patch of the Lease's spec that first tests this replica
        holds it: `spec`'s fields, and renewTime `wall`."""
        test = {"op": "test", "path": "/spec/holderIdentity", "value": self.identity}
        fields = {**spec, "renewTime": micro_time(wall)}
        return [test, *({"op": "add", "path": f"/spec/{k}", "value": v} for k, v in fields.items())]

    def renewed(self, record: Record, sent_at: float) -> None:
        """A renewal sent at `sent_at` succeeded. Answers of renewals in
        flight together may come back in any order: the lead runs to the
        latest send's deadline, and the Lease kept is the latest sent's."""
        if record.holder != self.identity:
            self.leading_until = float("-inf")
            return
        self.leading_until = max(self.leading_until, sent_at + self.timing.renew_deadline)
        if sent_at > self.observed_at:
            self.observed, self.observed_at = record, sent_at

    def written(self, record: Record, sent_at: float) -> None:
        """A write sent at `sent_at` succeeded and the server answered
        `record`: this replica leads until the renew deadline, counted from
        the send (the server may have stored it any time after)."""
        self.observed, self.observed_at = record, sent_at
        if record.holder == self.identity:
            self.leading_until = sent_at + self.timing.renew_deadline
        else:
            self.leading_until = float("-inf")

    def conflicted(self, sent_at: float) -> None:
        """A write (sent at `sent_at`) was refused because the Lease changed:
        it must be read again before the next write. Leading, if it was, ends
        at the deadline already set. A renewal answered later but sent before
        this one landed before it too: it extends no lead past its own
        deadline and brings back no older view of the Lease."""
        self.observed = None
        self.observed_at = max(self.observed_at, sent_at)

    def step_down(self) -> None:
        self.leading_until = float("-inf")
