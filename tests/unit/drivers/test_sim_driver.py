"""The simulator's driver semantics: capacity, ids, in-use, persistence,
config recover."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from vnpu_agent.drivers.base import (
    ANY_VNPU_ID,
    VNPU,
    CapacityError,
    InUseError,
    InvalidIdError,
    InvalidTemplateError,
    NotFoundError,
)
from vnpu_agent.drivers.sim import SimDriver, parse_layout
from vnpu_agent.drivers.sim.state import SimStateError

GB = 1024
MakeSim = Callable[..., SimDriver]


def test_layout_makes_chips_in_order(make_sim: MakeSim) -> None:
    sim = make_sim({"910B3": 2, "310P3": 1})
    chips = sim.list_chips()
    assert [(c.index, c.model, c.physical_id, c.card_id, c.device_id) for c in chips] == [
        (0, "910B3", 0, 0, 0),
        (1, "910B3", 1, 1, 0),
        (2, "310P3", 2, 2, 0),
    ]
    assert [(c.vnpu_id_min, c.vnpu_id_max) for c in chips] == [(100, 115), (116, 131), (132, 139)]
    first = chips[0]
    assert (first.aicore_free, first.memory_free_mb, first.aicpu_free) == (20, 64 * GB, 7)
    assert first.healthy


def test_created_vnpus_use_up_the_chip(make_sim: MakeSim) -> None:
    sim = make_sim()
    created = sim.create_vnpu(0, "vir10_3c_32g", 100)
    assert created == VNPU(id=100, chip=0, template="vir10_3c_32g", in_use=False)
    chip = sim.list_chips()[0]
    assert (chip.aicore_free, chip.memory_free_mb, chip.aicpu_free, chip.media_free) == (
        10,
        32 * GB,
        4,
        5,
    )
    assert sim.list_vnpus(0) == [created]


def test_capacity_error_has_the_kernel_text(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir10_3c_32g", 100)
    sim.create_vnpu(0, "vir05_1c_16g", 101)
    with pytest.raises(CapacityError) as caught:
        sim.create_vnpu(0, "vir10_3c_32g", 102)
    err = caught.value
    assert err.code == -8001
    assert err.driver_message == (
        "check aicore num failed, phy_id:0, core_need:10, used:15, total:20"
    )
    assert "not enough AICore on chip 0: vir10_3c_32g needs 10, 5 of 20 free" in str(err)
    assert [v.id for v in sim.list_vnpus(0)] == [100, 101]


def test_memory_is_checked_too(make_sim: MakeSim) -> None:
    sim = make_sim("910B4=1")
    sim.create_vnpu(0, "vir10_3c_16g", 100)
    sim.create_vnpu(0, "vir05_1c_8g", 101)
    sim.create_vnpu(0, "vir05_1c_8g", 102)
    with pytest.raises(CapacityError, match="check aicore num failed"):
        sim.create_vnpu(0, "vir05_1c_8g", 103)


def test_media_template_is_alone_on_its_chip(make_sim: MakeSim) -> None:
    sim = make_sim("910B4=1")
    sim.create_vnpu(0, "vir10_4c_16g_m", 100)
    with pytest.raises(CapacityError) as caught:
        sim.create_vnpu(0, "vir05_1c_8g", 101)
    assert caught.value.driver_message.startswith("check media num failed, phy_id:0, media_need:2")
    sim.create_vnpu(0, "vir10_3c_16g_nm", 101)
    assert sim.list_chips()[0].aicore_free == 0


def test_310p_takes_seven_then_stops_on_aicpu(make_sim: MakeSim) -> None:
    sim = make_sim("310P3=1")
    for i in range(6):
        sim.create_vnpu(0, "vir01", 100 + i)
    with pytest.raises(CapacityError, match="check aicpu num failed"):
        sim.create_vnpu(0, "vir02", 106)
    sim.create_vnpu(0, "vir02_1c", 106)
    with pytest.raises(CapacityError):
        sim.create_vnpu(0, "vir01", 107)


def test_unknown_template(make_sim: MakeSim) -> None:
    sim = make_sim()
    with pytest.raises(InvalidTemplateError, match="910B3 offers no template 'vir01'"):
        sim.create_vnpu(0, "vir01", 100)


def test_id_outside_the_chips_range(make_sim: MakeSim) -> None:
    sim = make_sim("910B3=2")
    with pytest.raises(InvalidIdError, match="outside chip 1's range 116-131") as caught:
        sim.create_vnpu(1, "vir05_1c_16g", 100)
    assert "vdev_id(100) is invalid" in caught.value.driver_message
    with pytest.raises(InvalidIdError):
        sim.create_vnpu(0, "vir05_1c_16g", 116)


def test_duplicate_id_is_refused_and_the_original_survives(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 103)
    with pytest.raises(InvalidIdError, match="vNPU id 103 is already taken"):
        sim.create_vnpu(0, "vir05_1c_16g", 103)
    assert sim.list_vnpus(0) == [VNPU(103, 0, "vir05_1c_16g", False)]


def test_driver_picks_the_lowest_free_id(make_sim: MakeSim) -> None:
    sim = make_sim("910B3=1,310P3=1")
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    assert sim.create_vnpu(0, "vir05_1c_16g", ANY_VNPU_ID).id == 101
    assert sim.create_vnpu(1, "vir01", ANY_VNPU_ID).id == 116
    ids = {v.id for chip in (0, 1) for v in sim.list_vnpus(chip)}
    assert ids == {100, 101, 116}


def test_unknown_chip(make_sim: MakeSim) -> None:
    sim = make_sim()
    with pytest.raises(NotFoundError, match="no chip 4 on this node") as caught:
        sim.create_vnpu(4, "vir05_1c_16g", 100)
    assert caught.value.code == -8007
    with pytest.raises(NotFoundError):
        sim.list_vnpus(-1)
    with pytest.raises(NotFoundError):
        sim.list_templates(1)


def test_destroy_in_use_is_refused_until_released(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    assert sim.list_vnpus(0)[0].in_use is False  # allocated but never opened
    assert sim.open_vnpu(100).in_use
    with pytest.raises(InUseError) as caught:
        sim.destroy_vnpu(0, 100)
    assert caught.value.driver_message == "vdev_id(100) is inused"
    assert sim.list_vnpus(0)[0].in_use
    sim.release_vnpu(100)
    sim.destroy_vnpu(0, 100)
    assert sim.list_vnpus(0) == []
    assert sim.list_chips()[0].aicore_free == 20


def test_destroy_of_a_missing_vnpu(make_sim: MakeSim) -> None:
    sim = make_sim("910B3=2")
    sim.create_vnpu(1, "vir05_1c_16g", 116)
    with pytest.raises(NotFoundError, match="chip 0 has no vNPU 116"):
        sim.destroy_vnpu(0, 116)  # exists, but on another chip
    with pytest.raises(NotFoundError):
        sim.destroy_vnpu(0, 100)


def test_open_and_release_of_a_missing_vnpu(make_sim: MakeSim) -> None:
    sim = make_sim()
    with pytest.raises(NotFoundError):
        sim.open_vnpu(100)
    with pytest.raises(NotFoundError):
        sim.release_vnpu(100)


def test_state_persists_across_instances(make_sim: MakeSim, state_path: Path) -> None:
    sim = make_sim("910B3=2")
    sim.create_vnpu(1, "vir10_3c_32g", 117)
    sim.open_vnpu(117)
    sim.set_config_recover(False)
    again = SimDriver(state_path)  # no layout: reopen what is there
    assert again.list_vnpus(1) == [VNPU(117, 1, "vir10_3c_32g", True)]
    assert not again.config_recover_enabled()
    assert SimDriver(state_path, {"910B3": 2}).list_chips()[1].aicore_free == 10


def test_state_for_other_chips_is_refused(make_sim: MakeSim, state_path: Path) -> None:
    make_sim("910B3=2")
    with pytest.raises(SimStateError, match="made for chips 910B3=2, not 910B3=1,310P3=1"):
        SimDriver(state_path, "910B3=1,310P3=1")


def test_missing_state_needs_a_layout(state_path: Path) -> None:
    with pytest.raises(SimStateError, match="does not exist; give a chip layout"):
        SimDriver(state_path)


@pytest.mark.parametrize(
    "content",
    ["", "{not json", "[]", '{"version": 99}', '{"version": 1, "chips": "x"}'],
)
def test_corrupt_state_is_a_clear_error(state_path: Path, content: str) -> None:
    state_path.write_text(content)
    with pytest.raises(SimStateError, match="is corrupt"):
        SimDriver(state_path)


def test_hand_edited_state_with_wrong_types_is_refused(make_sim: MakeSim, state_path: Path) -> None:
    make_sim()
    data = json.loads(state_path.read_text())
    data["vnpus"] = [{"id": "100", "chip": 0, "template": "vir05_1c_16g", "in_use": False}]
    state_path.write_text(json.dumps(data))
    with pytest.raises(SimStateError, match="corrupt"):
        SimDriver(state_path).list_vnpus(0)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("910B3", "not MODEL=COUNT"),
        ("999X=1", "unknown chip model '999X'"),
        ("910B3=0", "must be a positive integer"),
        ("910B3=two", "must be a positive integer"),
        ({"910B3": 65}, "1 to 64 chips"),
    ],
)
def test_bad_layouts(layout: str | dict[str, int], message: str) -> None:
    with pytest.raises(SimStateError, match=message):
        parse_layout(layout)


def test_layout_forms_agree() -> None:
    assert parse_layout("910B3=2, 910b3=1,Ascend 310P3=2") == [("910B3", 3), ("310P3", 2)]
    assert parse_layout({"910B3": 4}) == [("910B3", 4)]


# ------------------------------------------------------------- config recover


def test_recover_file_lines_follow_creates_and_destroys(
    make_sim: MakeSim, state_path: Path
) -> None:
    sim = make_sim("910B3=1,310P3=1")
    assert sim.recover_path == state_path.parent / "vnpu.cfg"
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.create_vnpu(1, "vir01", 118)
    sim.create_vnpu(0, "vir10_3c_32g", 101)
    assert sim.recover_path.read_text().splitlines() == [
        "0:100:npu-smi set -t create-vnpu -i 0 -c 0 -f vir05_1c_16g -v 100",
        "1:118:npu-smi set -t create-vnpu -i 1 -c 0 -f vir01 -v 118",
        "0:101:npu-smi set -t create-vnpu -i 0 -c 0 -f vir10_3c_32g -v 101",
    ]
    sim.destroy_vnpu(0, 100)
    assert [ln.split(":")[1] for ln in sim.recover_path.read_text().splitlines()] == ["118", "101"]


def test_reboot_replays_the_recover_file(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.create_vnpu(0, "vir05_1c_16g", 102)
    sim.open_vnpu(102)
    sim.destroy_vnpu(0, 100)
    report = sim.reboot()
    assert report.replayed == [102]
    assert report.skipped == []
    # back, but no container holds it any more
    assert sim.list_vnpus(0) == [VNPU(102, 0, "vir05_1c_16g", False)]
    assert sim.snapshot()["boot_count"] == 1


def test_reboot_without_recover_mode_loses_everything(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.set_config_recover(False)
    assert not sim.config_recover_enabled()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    assert not sim.recover_path.exists()
    assert sim.reboot().replayed == []
    assert sim.list_vnpus(0) == []


def test_lines_written_before_recover_was_turned_off_come_back_later(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.set_config_recover(False)
    sim.reboot()
    assert sim.list_vnpus(0) == []
    sim.set_config_recover(True)
    assert sim.reboot().replayed == [100]


def test_replay_skips_bad_lines_and_keeps_the_good_ones(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    with sim.recover_path.open("a") as f:
        f.write("garbage\n")
        f.write("7:212:npu-smi set -t create-vnpu -i 7 -c 0 -f vir05_1c_16g -v 212\n")
        f.write("0:101:npu-smi set -t create-vnpu -i 0 -c 0 -f vir01 -v 101\n")
        f.write("0:100:npu-smi set -t create-vnpu -i 0 -c 0 -f vir05_1c_16g -v 100\n")
        f.write("0:103:npu-smi set -t create-vnpu -i 0 -c 0 -f vir10_3c_32g -v 103 -g 1\n")
    report = sim.reboot()
    assert report.replayed == [100, 103]
    assert len(report.skipped) == 4
    assert "not a create-vnpu record" in report.skipped[0]
    assert "no chip with physical id 7" in report.skipped[1]
    assert "offers no template 'vir01'" in report.skipped[2]
    assert "already taken" in report.skipped[3]


def test_snapshot_shows_everything(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    snap = sim.snapshot()
    assert snap["chips"][0]["templates"] == ["vir05_1c_16g", "vir10_3c_32g"]
    assert snap["vnpus"] == [{"id": 100, "chip": 0, "template": "vir05_1c_16g", "in_use": False}]
    assert snap["recover_lines"] == [
        "0:100:npu-smi set -t create-vnpu -i 0 -c 0 -f vir05_1c_16g -v 100"
    ]
    json.dumps(snap)  # JSON-ready


def test_unreadable_recover_file_is_a_clear_error(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.recover_path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SimStateError, match="cannot read config-recover file"):
        sim.reboot()
    assert [v.id for v in sim.list_vnpus(0)] == [100]  # no half-done reboot
