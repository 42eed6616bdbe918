"""The orphan collector's rules, step by step on a fake clock."""

from __future__ import annotations

from vnpu_agent.drivers.base import VNPU
from vnpu_agent.gc import OrphanTracker


def _v(vnpu_id: int, in_use: bool = False) -> VNPU:
    return VNPU(id=vnpu_id, chip=0, template="vir05_1c_16g", in_use=in_use)


def test_referenced_vnpus_are_never_collected_however_long_idle() -> None:
    gc = OrphanTracker(grace_seconds=10, policy="collect")
    for t in range(0, 10_000, 7):
        d = gc.evaluate([_v(100)], referenced={100}, owned={100}, now=float(t), synced=True)
        assert d.destroy == []


def test_orphan_is_collected_only_after_the_grace_period() -> None:
    gc = OrphanTracker(grace_seconds=10, policy="keep")
    assert gc.evaluate([_v(100)], set(), {100}, now=0, synced=True).waiting == [_v(100)]
    assert gc.evaluate([_v(100)], set(), {100}, now=9.9, synced=True).destroy == []
    assert gc.evaluate([_v(100)], set(), {100}, now=10, synced=True).destroy == [_v(100)]


def test_nothing_is_collected_without_a_synced_view_and_the_clock_restarts() -> None:
    gc = OrphanTracker(grace_seconds=10, policy="collect")
    gc.evaluate([_v(100)], set(), {100}, now=0, synced=True)
    assert gc.evaluate([_v(100)], set(), {100}, now=20, synced=False).destroy == []
    # The view came back: the orphan must stay unreferenced a full grace again.
    assert gc.evaluate([_v(100)], set(), {100}, now=21, synced=True).destroy == []
    assert gc.evaluate([_v(100)], set(), {100}, now=31, synced=True).destroy == [_v(100)]


def test_in_use_orphans_are_reported_never_collected_and_reset_the_clock() -> None:
    gc = OrphanTracker(grace_seconds=10, policy="collect")
    gc.evaluate([_v(100)], set(), {100}, now=0, synced=True)
    d = gc.evaluate([_v(100, in_use=True)], set(), {100}, now=50, synced=True)
    assert d.destroy == []
    assert d.in_use == [_v(100, in_use=True)]
    assert gc.evaluate([_v(100)], set(), {100}, now=55, synced=True).destroy == []
    assert gc.evaluate([_v(100)], set(), {100}, now=65, synced=True).destroy == [_v(100)]


def test_a_reference_in_between_restarts_the_clock() -> None:
    gc = OrphanTracker(grace_seconds=10, policy="collect")
    gc.evaluate([_v(100)], set(), {100}, now=0, synced=True)
    gc.evaluate([_v(100)], {100}, {100}, now=5, synced=True)
    assert gc.evaluate([_v(100)], set(), {100}, now=12, synced=True).destroy == []


def test_foreign_vnpus_follow_the_policy() -> None:
    keep = OrphanTracker(grace_seconds=0, policy="keep")
    d = keep.evaluate([_v(100)], set(), owned=set(), now=1, synced=True)
    assert d.destroy == []
    assert d.kept_foreign == [_v(100)]
    collect = OrphanTracker(grace_seconds=0, policy="collect")
    assert collect.evaluate([_v(100)], set(), owned=set(), now=1, synced=True).destroy == [_v(100)]
