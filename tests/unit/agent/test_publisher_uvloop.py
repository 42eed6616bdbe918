"""The VNPUNode write timer under uvloop, the loop the agent runs on: uvloop
answers `call_later(0)` with a plain Handle (no `when()`), so a second
change before a due write runs must not ask the handle when it is due (it
did, and the AttributeError broke the allocation watch)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, cast

import uvloop

from vnpu_agent.config import AgentSettings
from vnpu_agent.publisher import NodePublisher


def publisher() -> NodePublisher:
    settings = AgentSettings(node_name="n")
    # mark_dirty reads only the clock, the settings and its own timer.
    none = cast(Any, None)
    return NodePublisher("n", none, {}, none, settings, none, clock=lambda: 100.0)


def on_uvloop(coro: Coroutine[Any, Any, None]) -> None:
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


def test_changes_before_a_due_write_runs_keep_one_timer_on_uvloop() -> None:
    pub = publisher()
    seen: list[Any] = []

    async def main() -> None:
        pub.mark_dirty()  # due now: a plain Handle on uvloop
        first = pub._pending
        seen.append(first)
        pub.mark_dirty()  # not earlier: the pending one stays
        pub.mark_dirty(at_least=5.0)  # later still: stays
        seen.append(pub._pending)
        assert pub._pending is not None
        pub._pending.cancel()

    on_uvloop(main())
    assert seen[0] is not None
    assert seen[1] is seen[0]


def test_a_write_wanted_sooner_replaces_a_later_one_on_uvloop() -> None:
    pub = publisher()

    async def main() -> None:
        pub.mark_dirty(at_least=30.0)  # a settled write, put off
        later = pub._pending
        pub.mark_dirty()  # a vNPU gone: wants it now
        assert pub._pending is not later
        assert later is not None
        assert later.cancelled()
        assert pub._pending is not None
        pub._pending.cancel()

    on_uvloop(main())
