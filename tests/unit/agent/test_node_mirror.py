"""NodeMirror: when a difference between the VNPUNode the watch shows and
the agent's last write may be only the watch running behind. The event
orders the agent meets in place are tested in test_vnpunode_restore.py."""

from __future__ import annotations

from typing import Any

from vnpu_agent.mirror import ECHO_WAIT_SECONDS, NodeMirror
from vnpu_common.wire import names


def obj(rv: int, free: int = 10) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "resourceVersion": str(rv), "labels": {names.LABEL_NODE: "n1"}},
        "status": {"freeAICore": free},
    }


def written(mirror: NodeMirror, answer: dict[str, Any], now: float = 0.0) -> None:
    mirror.write_started()
    mirror.write_answered(answer, now)


def test_older_events_keep_the_wait_until_the_echo() -> None:
    m = NodeMirror("n1")
    m.on_event("SYNC", obj(1))
    written(m, obj(2, free=5))
    m.on_event("MODIFIED", obj(1, free=7))  # late, older than our write
    assert m.differs() == "status"
    assert m.echo_pending(1.0)
    m.on_event("MODIFIED", obj(2, free=5))
    assert not m.echo_pending(1.0)
    assert m.differs() is None


def test_a_write_that_changed_nothing_has_no_echo_to_wait_for() -> None:
    m = NodeMirror("n1")
    m.on_event("MODIFIED", obj(4))
    written(m, obj(4))  # the server answers an unchanged object with its version
    assert not m.echo_pending(0.0)
    m.on_event("MODIFIED", obj(5, free=0))  # then someone edits it
    assert m.differs() == "status"
    assert not m.echo_pending(0.1)


def test_an_echo_that_came_before_the_answer_ends_the_wait() -> None:
    m = NodeMirror("n1")
    m.on_event("SYNC", obj(1))
    m.write_started()
    m.on_event("MODIFIED", obj(2, free=5))  # the echo, ahead of the answer
    m.on_event("DELETED", obj(3, free=5))  # then a deletion
    m.write_answered(obj(2, free=5), 0.0)
    assert not m.echo_pending(0.0)
    assert m.differs() == "deleted"  # the answer does not hide the newer deletion


def test_a_listing_ends_the_wait() -> None:
    m = NodeMirror("n1")
    written(m, obj(2, free=5))
    assert m.echo_pending(0.0)
    m.on_event("SYNC", obj(3, free=0))  # a re-list after a 410: the newest state only
    assert not m.echo_pending(0.0)
    assert m.differs() == "status"


def test_the_wait_has_a_bound() -> None:
    m = NodeMirror("n1")
    written(m, obj(2, free=5), now=100.0)
    m.on_event("MODIFIED", obj(1, free=0))
    assert m.echo_pending(100.0 + ECHO_WAIT_SECONDS - 0.1)
    assert not m.echo_pending(100.0 + ECHO_WAIT_SECONDS)


def test_a_failed_write_keeps_the_wait_for_the_write_before_it() -> None:
    m = NodeMirror("n1")
    written(m, obj(2, free=5))
    m.write_started()
    m.on_event("MODIFIED", obj(1))  # late, while the next write fails
    m.write_failed()
    assert m.echo_pending(0.0)
    m.on_event("MODIFIED", obj(2, free=5))
    assert not m.echo_pending(0.0)
    assert m.differs() is None
