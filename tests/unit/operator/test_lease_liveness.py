"""LeaseLiveness: a node's agent is live until its Lease runs out, told by a
timer; renewals read on every poll must neither re-arm that timer each time
nor keep a node live past its last renewal."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.leases import LeaseLiveness

NS = "vnpu-system"


def lease(node: str, renewed: float, duration: int = 1) -> Raw:
    stamp = dt.datetime.fromtimestamp(renewed, dt.UTC).isoformat().replace("+00:00", "Z")
    return {
        "metadata": {"name": f"{names.LEASE_PREFIX}{node}", "namespace": NS},
        "spec": {"renewTime": stamp, "leaseDurationSeconds": duration},
    }


async def test_renewals_keep_one_timer_and_the_node_runs_out_after_the_last() -> None:
    flips: list[tuple[str, bool]] = []
    # grace -0.8: a 1 s Lease runs out 0.2 s after its renewal, so the test is short.
    liveness = LeaseLiveness(NS, -0.8, lambda n: flips.append((n, liveness.live(n))))
    start = time.time()
    liveness.lease_event(None, lease("n1", start))
    first = liveness._timers["n1"]
    renewals = 0
    while time.time() < start + 0.5:
        await asyncio.sleep(0.05)
        renewals += 1
        renewed = time.time()
        liveness.lease_event(None, lease("n1", renewed))
        liveness.lease_event(None, lease("n1", renewed))  # read again, unchanged
        if time.time() < start + 0.25:
            # Every renewal read before the first expiry keeps the armed timer.
            assert liveness._timers["n1"] is first
    assert renewals >= 5
    assert liveness.live("n1")
    assert flips == [("n1", True)]  # renewals read while live flip nothing
    # The first timer fired at the first expiry and armed itself again for the
    # renewal read since: the node stayed live throughout.
    assert liveness._timers["n1"] is not first

    await asyncio.sleep(0.5)  # no renewal: the last one runs out
    assert flips == [("n1", True), ("n1", False)]
    assert "n1" not in liveness._timers
    liveness.close()


async def test_a_shorter_lease_moves_the_timer_earlier() -> None:
    flips: list[tuple[str, bool]] = []
    liveness = LeaseLiveness(NS, -0.8, lambda n: flips.append((n, liveness.live(n))))
    now = time.time()
    liveness.lease_event(None, lease("n1", now, duration=30))
    liveness.lease_event(None, lease("n1", now, duration=1))  # shortened: runs out in 0.2 s
    await asyncio.sleep(0.5)
    assert flips == [("n1", True), ("n1", False)]
    liveness.close()


async def test_an_unchanged_lease_read_after_it_ran_out_reports_it() -> None:
    wall = [1000.0]
    flips: list[tuple[str, bool]] = []
    liveness = LeaseLiveness(
        NS, 0, lambda n: flips.append((n, liveness.live(n))), wall=lambda: wall[0]
    )
    liveness.lease_event(None, lease("n1", 1000.0, duration=10))
    wall[0] += 60  # the timer has not fired (real time): the poll's read tells
    liveness.lease_event(None, lease("n1", 1000.0, duration=10))
    assert flips == [("n1", True), ("n1", False)]
    liveness.lease_event("DELETED", lease("n1", 1000.0, duration=10))
    liveness.lease_event(None, lease("n1", 1060.0, duration=10))  # back: read afresh
    assert flips[-1] == ("n1", True)
    liveness.close()
