"""An agent upgraded from one that named its slices unpadded (`-devices-2`,
`-devices-10`) rewrites the pool under the zero-padded names and deletes
every slice of the old names: a pool's slices the desired set does not name
are surplus (publisher.PoolPublisher.sync)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

from test_dra_pool import FakeSlices, dra_agent, pool_of


def unpadded(name: str) -> str:
    return re.sub(r"-0*([0-9]+)$", r"-\1", name)


async def test_slices_under_the_old_unpadded_names_are_deleted_on_upgrade(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await dra_agent(tmp_path, fake, chips="310P3=16")
    await agent.publisher.publish()
    await pool_of(agent).sync()
    padded = sorted(fake.objects)
    assert padded[0] == "n1-vnpu-counters-000"
    # What the old agent left: the same pool under the names it gave them.
    old = {unpadded(n): copy.deepcopy(o) for n, o in fake.objects.items()}
    for name, obj in old.items():
        obj["metadata"]["name"] = name
    left = sorted(old)
    assert not set(left) & set(padded)
    fake.objects, fake.writes = old, []

    upgraded = await dra_agent(tmp_path, fake, chips="310P3=16")
    await upgraded.publisher.publish()
    await pool_of(upgraded).sync()
    assert sorted(fake.objects) == padded
    assert sorted(n for op, n in fake.writes if op == "delete") == left
    assert sorted(n for op, n in fake.writes if op == "create") == padded
    assert fake.generations() == {2}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in fake.objects.values()} == {len(padded)}
