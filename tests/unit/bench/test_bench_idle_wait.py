"""The idle window starts once every VNPUNode write the agents' settle interval
may have put off is due (bench.run.put_off_due): the interval after an agent's
last VNPUNode write, and after its last release, which an agent writes the
settle interval after it (plus the minimum interval before it looks) whether or
not the node wrote lately. Without the release's term the writes of releases
made after the last VNPUNode write landed in the idle window."""

from __future__ import annotations

from typing import Any

from bench.run import put_off_due

from vnpu_common.wire import names

SETTLE, MIN = 30.0, 5.0


def event(agent: str, verb: str, resource: str, at: str, sub: str = "") -> dict[str, Any]:
    ref = {"resource": resource, **({"subresource": sub} if sub else {})}
    return {"userAgent": agent + "/1", "verb": verb, "objectRef": ref, "stageTimestamp": at}


AGENT, OPERATOR = names.USER_AGENT_AGENT, names.USER_AGENT_OPERATOR
T0 = "2026-11-27T12:00:00.000000Z"  # epoch 1795780800


def test_the_last_vnpunode_write_and_the_last_release_each_set_a_due_time() -> None:
    node_write = event(AGENT, "patch", names.NODE_PLURAL, T0, "status")
    assert put_off_due([node_write], SETTLE, MIN) == 1795780800 + SETTLE
    # A release 10 s after the node's last write is written 30 s after the release.
    release = event(AGENT, "patch", names.ALLOCATION_PLURAL, "2026-11-27T12:00:10.000000Z")
    assert put_off_due([node_write, release], SETTLE, MIN) == 1795780810 + MIN + SETTLE


def test_what_is_no_agent_write_or_no_release_sets_nothing() -> None:
    ignored = [
        event(OPERATOR, "patch", names.ALLOCATION_PLURAL, T0),  # the operator's
        event(AGENT, "patch", names.ALLOCATION_PLURAL, T0, "status"),  # Ready, not a release
        event(AGENT, "patch", "leases", T0),
        event(AGENT, "get", names.NODE_PLURAL, T0),
    ]
    assert put_off_due(ignored, SETTLE, MIN) is None
    assert put_off_due([], SETTLE, MIN) is None
