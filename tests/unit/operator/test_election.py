"""The leader election's rules (vnpu_operator.election): who may take the
Lease when, and the fence that stops an old leader before anyone else can
start, with plain numbers for the clocks."""

from __future__ import annotations

from typing import Any

import pytest

from vnpu_operator.election import Election, Record, Timing

T = Timing(lease_seconds=15, renew_deadline=10.0, retry_seconds=2.0)


def lease(holder: str, version: str, *, transitions: int = 0, duration: int = 15) -> Record:
    return Record.from_api(
        {
            "metadata": {"resourceVersion": version},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "leaseTransitions": transitions,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
            },
        }
    )


def written(e: Election, body: dict[str, Any], version: str, sent: float) -> None:
    e.written(Record.from_api({**body, "metadata": {"resourceVersion": version}}), sent)


def apply(lease: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The API server's JSON patch of a Lease's spec fields: a failed test
    refuses the whole patch."""
    spec = dict(lease["spec"])
    for op in patch:
        field = op["path"].removeprefix("/spec/")
        if op["op"] == "test" and spec.get(field) != op["value"]:
            raise ValueError(f"test failed: {field}")
        if op["op"] == "add":
            spec[field] = op["value"]
    return {**lease, "spec": spec}


def leader() -> Election:
    """ "a", which took the unheld Lease with a write sent at 0."""
    a = Election("a", T)
    a.observe(None, now=0.0)
    written(a, a.body("l", "ns", wall=0.0), "1", sent=0.0)
    return a


def test_timing_must_stop_before_the_lease_can_be_taken() -> None:
    with pytest.raises(ValueError, match="renew deadline < lease"):
        Timing(lease_seconds=10, renew_deadline=10.0, retry_seconds=2.0)
    with pytest.raises(ValueError, match="retry < renew deadline"):
        Timing(lease_seconds=15, renew_deadline=2.0, retry_seconds=2.0)


def test_no_lease_is_taken_at_once_and_leads_until_the_renew_deadline() -> None:
    e = Election("a", T)
    e.observe(None, now=100.0)
    assert e.wants(100.0)
    body = e.body("l", "ns", wall=0.0)
    assert "resourceVersion" not in body["metadata"]  # a create
    assert body["spec"]["holderIdentity"] == "a"
    assert body["spec"]["leaseTransitions"] == 0
    written(e, body, "1", sent=100.0)
    assert e.may_write(109.9)
    assert not e.may_write(110.0)  # no renewal came back within the deadline


def test_the_deadline_counts_from_the_send_not_the_answer() -> None:
    e = Election("a", T)
    e.observe(None, now=0.0)
    written(e, e.body("l", "ns", wall=0.0), "1", sent=0.0)
    # The renewal sent at 5 answered at 9: leading until 15, not 19.
    written(e, e.body("l", "ns", wall=0.0), "2", sent=5.0)
    assert e.may_write(14.9)
    assert not e.may_write(15.0)


def test_a_held_lease_is_taken_only_after_its_duration_as_this_replica_saw_it() -> None:
    b = Election("b", T)
    b.observe(lease("a", "7"), now=50.0)
    assert not b.wants(64.9)
    b.observe(lease("a", "7"), now=60.0)  # the same version read again: no renewal
    assert not b.wants(64.9)
    assert b.wants(65.0)
    body = b.body("l", "ns", wall=0.0)
    assert body["metadata"]["resourceVersion"] == "7"  # the API server's 409 picks one taker
    assert body["spec"]["leaseTransitions"] == 1


def test_a_renewal_seen_restarts_the_count() -> None:
    b = Election("b", T)
    b.observe(lease("a", "7"), now=50.0)
    b.observe(lease("a", "8"), now=60.0)
    assert not b.wants(74.9)
    assert b.wants(75.0)


def test_an_old_leader_stops_before_a_follower_can_start() -> None:
    """The leader renews at 0 (sent) and is frozen; the follower reads that
    renewal no earlier than it was sent, so it can take over at 15 at the
    soonest, and the leader refused every write from 10 on."""
    a, b = Election("a", T), Election("b", T)
    a.observe(None, now=0.0)
    body = a.body("l", "ns", wall=0.0)
    written(a, body, "1", sent=0.0)
    b.observe(lease("a", "1"), now=0.0)
    first_take = next(t / 10 for t in range(0, 400) if b.wants(t / 10))
    last_write = max(t / 10 for t in range(0, 400) if a.may_write(t / 10))
    assert last_write < 10.0 <= first_take - 5.0


def test_the_holder_renews_its_own_lease_at_once() -> None:
    """A restarted container of the same pod (same identity) need not wait."""
    a = Election("a", T)
    a.observe(lease("a", "3", transitions=2), now=0.0)
    assert a.wants(0.0)
    body = a.body("l", "ns", wall=0.0)
    assert body["spec"]["leaseTransitions"] == 2
    assert body["spec"]["acquireTime"] == "2026-01-01T00:00:00.000000Z"


def test_seeing_another_holder_ends_leading_at_once() -> None:
    a = leader()
    a.observe(lease("b", "2"), now=1.0)
    assert not a.may_write(1.0)


def test_a_released_lease_is_free_and_only_its_holder_releases() -> None:
    a, b = Election("a", T), Election("b", T)
    a.observe(None, now=0.0)
    written(a, a.body("l", "ns", wall=0.0), "1", sent=0.0)
    assert b.release_patch(wall=0.0) is None
    patch = a.release_patch(wall=0.0)
    assert patch is not None
    # Refused by the API server unless "a" still holds it.
    assert patch[0] == {"op": "test", "path": "/spec/holderIdentity", "value": "a"}
    released = apply(a.body("l", "ns", wall=0.0), patch)
    assert released["spec"]["holderIdentity"] == ""
    b.observe(Record.from_api({**released, "metadata": {"resourceVersion": "2"}}), now=1.0)
    assert b.wants(1.0)


def takeover_after_kill(timing: Timing, kill: float, phase: float) -> tuple[float, float]:
    """A leader renewing every retry (from 0) is killed at `kill`; a follower
    polls every retry from `phase`. Returns (the follower's takeover time, the
    time the dead leader's fence closed), both after the kill, by the rules."""
    leader, follower = Election("a", timing), Election("b", timing)
    leader.observe(None, now=0.0)
    record: Record | None = None
    version, t = 0, 0.0
    renewals: list[tuple[float, Record]] = []
    while t < kill:
        version += 1
        body = leader.body("l", "ns", wall=t)
        record = Record.from_api({**body, "metadata": {"resourceVersion": str(version)}})
        leader.written(record, t)
        renewals.append((t, record))
        t += timing.retry_seconds
    poll = phase
    while True:
        seen = [r for sent, r in renewals if sent <= poll]
        follower.observe(seen[-1] if seen else None, now=poll)
        if poll >= kill and follower.wants(poll):
            fence = leader.leading_until
            return poll - kill, fence - kill
        poll += timing.retry_seconds


def test_the_default_timing_resumes_within_five_seconds_of_a_kill_and_fences_first() -> None:
    """The issue's goal (placements resume within 5 s of the leader's SIGKILL):
    over every kill instant and follower phase, the takeover comes within 5 s
    less a placement's few tenths, and only after the dead leader's fence closed."""
    from vnpu_operator.config import OperatorSettings

    timing = Timing()
    assert OperatorSettings().election_timing() == timing
    worst = 0.0
    steps = 20
    for i in range(steps):
        for j in range(steps):
            kill = 10.0 + timing.retry_seconds * i / steps
            phase = timing.retry_seconds * j / steps
            takeover, fence = takeover_after_kill(timing, kill, phase)
            assert fence < takeover, (kill, phase)
            worst = max(worst, takeover)
    assert worst <= 4.7, worst
    # client-go's defaults would not do: the same rules give 14 s here.
    assert takeover_after_kill(Timing(15, 10.0, 2.0), 10.0, 0.0)[0] > 12


def test_a_renewal_is_refused_unless_this_replica_still_holds_the_lease() -> None:
    a = Election("a", T)
    a.observe(None, now=0.0)
    body = a.body("l", "ns", wall=0.0)
    written(a, body, "1", sent=0.0)
    renewal = a.renewal(wall=1.0)
    renewed = apply(body, renewal)
    assert renewed["spec"]["holderIdentity"] == "a"
    assert renewed["spec"]["renewTime"] == "1970-01-01T00:00:01.000000Z"
    assert renewed["spec"]["leaseDurationSeconds"] == 15
    taken = {**body, "spec": {**body["spec"], "holderIdentity": "b"}}
    with pytest.raises(ValueError, match="test failed"):
        apply(taken, renewal)


def test_renewals_answered_out_of_order_lead_to_the_latest_send_deadline() -> None:
    a = Election("a", T)
    a.observe(None, now=0.0)
    body = a.body("l", "ns", wall=0.0)
    written(a, body, "1", sent=0.0)
    # Sent at 2 and 4, both in flight; the one sent at 4 is answered first.
    a.renewed(lease("a", "3"), sent_at=4.0)
    a.renewed(lease("a", "2"), sent_at=2.0)
    assert a.may_write(13.9)
    assert not a.may_write(14.0)
    # The Lease kept is the latest sent's, not the last answered.
    assert a.observed is not None
    assert a.observed.version == "3"


def test_a_renewal_refused_ends_nothing_but_no_earlier_answer_brings_the_lease_back() -> None:
    a = leader()
    # The renewal sent at 4 found another holder; one sent at 2 comes back later.
    a.conflicted(sent_at=4.0)
    assert a.holder() == ""
    a.renewed(lease("a", "2"), sent_at=2.0)
    # It landed before the refused one: its own deadline holds, and the
    # Lease must be read again before any other write.
    assert a.may_write(11.9)
    assert not a.may_write(12.0)
    assert a.holder() == ""


def test_an_answer_naming_another_holder_ends_leading() -> None:
    a = leader()
    a.renewed(lease("b", "2"), sent_at=1.0)
    assert not a.may_write(1.0)


def test_renewals_in_flight_cover_the_deadline_at_most_six() -> None:
    assert Timing().renewals_in_flight == 6  # 3 s / 0.5 s
    assert Timing().connections == 7  # and one for a read
    assert Timing(15, 10.0, 2.0).renewals_in_flight == 5
    assert Timing(4, 3.0, 2.5).renewals_in_flight == 2
    assert Timing(60, 50.0, 0.5).renewals_in_flight == 6
