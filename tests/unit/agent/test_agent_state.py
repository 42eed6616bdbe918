"""Owned-id bookkeeping, inventory building, CDI specs and failpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vnpu_agent import cdi
from vnpu_agent.drivers.base import VNPU, ChipInfo, TemplateSpec
from vnpu_agent.failpoints import _parse
from vnpu_agent.inventory import build_status
from vnpu_agent.owned import OwnedIds
from vnpu_agent.watcher import label_selector
from vnpu_common.wire.models import VNPUNodeStatus


def test_owned_ids_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "n1" / "owned.json"
    owned = OwnedIds(path)
    owned.add(100)
    owned.add(117)
    owned.discard(100)
    assert OwnedIds(path).snapshot() == {117}


def test_owned_ids_are_journalled_not_rewritten_and_folded_in_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "n1" / "owned.json"
    owned = OwnedIds(path)
    snapshot = path.read_text()
    owned.add(100)
    owned.add(101)
    owned.discard(100)
    # Every change is one appended line; the snapshot is untouched.
    assert path.read_text() == snapshot
    assert owned.journal_path.read_text() == "+100\n+101\n-100\n"
    # A crash mid-append leaves a cut line: its change was never acted on.
    with owned.journal_path.open("a") as f:
        f.write("+10")
    restarted = OwnedIds(path)
    assert restarted.snapshot() == {101}
    assert json.loads(path.read_text()) == [101]
    assert not restarted.journal_path.exists()
    # The journal is folded in once it grows long.
    monkeypatch.setattr("vnpu_agent.owned.COMPACT_AFTER", 3)
    for vnpu_id in (1, 2, 3, 4):
        restarted.add(vnpu_id)
    assert json.loads(path.read_text()) == [1, 2, 3, 101]
    assert restarted.journal_path.read_text() == "+4\n"
    restarted.close()
    assert OwnedIds(path).snapshot() == {1, 2, 3, 4, 101}


def test_a_crash_between_snapshot_and_journal_removal_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "owned.json"
    path.write_text("[7, 9]")  # the snapshot already holds the journal's changes
    (tmp_path / "owned.json.log").write_text("+7\n+8\n-8\n+9\n")
    assert OwnedIds(path).snapshot() == {7, 9}


def test_corrupt_owned_state_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "owned.json"
    path.write_text('["x"]')
    with pytest.raises(ValueError, match="corrupt agent state"):
        OwnedIds(path)


def _chip(index: int, healthy: bool = True) -> ChipInfo:
    return ChipInfo(
        index=index, physical_id=index, card_id=index, device_id=0, model="910B3",
        healthy=healthy, aicore_total=20, aicore_free=15, memory_total_mb=65536,
        memory_free_mb=49152, aicpu_total=7, aicpu_free=6, media_total=0, media_free=0,
        vnpu_id_min=100 + 16 * index, vnpu_id_max=115 + 16 * index,
    )  # fmt: skip


def test_inventory_lists_owners_and_validates_against_the_model() -> None:
    status = build_status(
        driver="sim",
        chips=[_chip(0), _chip(1, healthy=False)],
        templates={0: [TemplateSpec("vir05_1c_16g", 5, 16384, 1, 0)], 1: []},
        vnpus={
            100: VNPU(100, 0, "vir05_1c_16g", False),
            101: VNPU(101, 0, "vir05_1c_16g", True),
        },
        allocations=[{"metadata": {"namespace": "ns", "name": "a"},
                      "spec": {"vnpuId": 100, "podUID": "u1"}}],
        conditions=[],
    )  # fmt: skip
    parsed = VNPUNodeStatus.model_validate(status)
    assert (parsed.chip_count, parsed.vnpu_count, parsed.free_aicore) == (2, 2, 15)
    vnpus = parsed.chips[0].vnpus
    assert [(v.id, v.allocation, v.pod_uid, v.in_use) for v in vnpus] == [
        (100, "ns/a", "u1", False),
        (101, None, None, True),
    ]
    assert parsed.chips[1].health == "Unhealthy"


def test_cdi_spec_maps_the_host_vnpu_into_the_container(tmp_path: Path) -> None:
    path = cdi.write(tmp_path, "n1", 117, "vir10_3c_32g")
    spec = json.loads(path.read_text())
    assert spec["kind"] == "vnpu.io/vnpu"
    edits = spec["devices"][0]["containerEdits"]
    assert edits["deviceNodes"][0] == {"path": "/dev/davinci117", "hostPath": "/dev/vdavinci117"}
    assert "ASCEND_VISIBLE_DEVICES=117" in edits["env"]
    cdi.remove(tmp_path, "n1", 117)
    cdi.remove(tmp_path, "n1", 117)  # idempotent
    assert not path.exists()


def test_failpoint_parsing_ignores_garbage() -> None:
    assert _parse("after-create=30, bad, x=y,before-finalizer=1.5") == {
        "after-create": 30.0,
        "before-finalizer": 1.5,
    }


def test_label_selector_for_one_and_many_nodes() -> None:
    assert label_selector(["n1"]) == "vnpu.io/node=n1"
    assert label_selector(["b", "a", "a"]) == "vnpu.io/node in (a,b)"
