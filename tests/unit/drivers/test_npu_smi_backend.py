"""The npu-smi backend end to end against the fake npu-smi (tests/fakes),
which prints the real formats from the simulator's state."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from vnpu_agent.drivers.base import (
    ANY_VNPU_ID,
    VNPU,
    CapacityError,
    Driver,
    DriverFailure,
    InUseError,
    InvalidIdError,
    InvalidTemplateError,
    MalformedOutputError,
    NotFoundError,
)
from vnpu_agent.drivers.npu_smi import NpuSmiDriver
from vnpu_agent.drivers.sim import SimDriver

MakeSim = Callable[..., SimDriver]


def test_inventory_matches_the_simulator(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim("910B4=1,310P3=1")
    sim.create_vnpu(0, "vir10_3c_16g", 100)
    sim.set_chip_health(1, False)
    driver = NpuSmiDriver(npu_smi)
    assert isinstance(driver, Driver)
    assert driver.list_chips() == sim.list_chips()
    assert driver.list_templates(0) == sim.list_templates(0)
    assert driver.list_templates(1) == sim.list_templates(1)


def test_physical_ids_from_the_newer_chip_list(
    make_sim: MakeSim, npu_smi: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_sim("310P3=2")
    monkeypatch.setenv("NPU_SMI_FAKE_PHYID", "1")
    chips = NpuSmiDriver(npu_smi).list_chips()
    assert [(c.physical_id, c.vnpu_id_min, c.vnpu_id_max) for c in chips] == [
        (0, 100, 107),
        (1, 116, 123),
    ]
    assert chips == sim.list_chips()


def test_create_list_destroy(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim()
    driver = NpuSmiDriver(npu_smi)
    assert driver.create_vnpu(0, "vir05_1c_16g", 101) == VNPU(101, 0, "vir05_1c_16g", False)
    picked = driver.create_vnpu(0, "vir10_3c_32g", ANY_VNPU_ID)
    assert picked == VNPU(100, 0, "vir10_3c_32g", False)
    sim.open_vnpu(101)
    assert driver.list_vnpus(0) == [
        VNPU(100, 0, "vir10_3c_32g", False),
        VNPU(101, 0, "vir05_1c_16g", True),
    ]
    driver.destroy_vnpu(0, 100)
    assert [v.id for v in sim.list_vnpus(0)] == [101]
    assert sim.snapshot()["recover_lines"] == [
        "0:101:npu-smi set -t create-vnpu -i 0 -c 0 -f vir05_1c_16g -v 101"
    ]


def test_destroy_in_use(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.open_vnpu(100)
    with pytest.raises(InUseError, match="vNPU 100 is in use") as caught:
        NpuSmiDriver(npu_smi).destroy_vnpu(0, 100)
    assert caught.value.code == -8001
    assert "destroy vnpu 100 failed" in caught.value.driver_message
    assert len(sim.list_vnpus(0)) == 1


def test_destroy_missing(make_sim: MakeSim, npu_smi: str) -> None:
    make_sim()
    with pytest.raises(NotFoundError, match="chip 0 has no vNPU 105"):
        NpuSmiDriver(npu_smi).destroy_vnpu(0, 105)


def test_create_failures_are_named(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim("910B3=2")
    driver = NpuSmiDriver(npu_smi)
    sim.create_vnpu(0, "vir10_3c_32g", 100)
    sim.create_vnpu(0, "vir10_3c_32g", 101)
    with pytest.raises(CapacityError, match="not enough AICore on chip 0") as capacity:
        driver.create_vnpu(0, "vir05_1c_16g", 102)
    assert capacity.value.code == -8001
    with pytest.raises(InvalidIdError, match=r"already taken \(by a vir10_3c_32g vNPU\)"):
        driver.create_vnpu(0, "vir05_1c_16g", 100)
    with pytest.raises(InvalidIdError, match="outside chip 1's range 116-131") as bad_id:
        driver.create_vnpu(1, "vir05_1c_16g", 100)
    assert bad_id.value.driver_message == "Error parameter of -v."
    with pytest.raises(InvalidTemplateError, match="offers no template 'vir01'"):
        driver.create_vnpu(1, "vir01", 116)
    with pytest.raises(InvalidIdError, match="outside 100-1123"):
        driver.create_vnpu(1, "vir05_1c_16g", 65535)


def test_unknown_chip(make_sim: MakeSim, npu_smi: str) -> None:
    make_sim()
    with pytest.raises(NotFoundError, match="no chip with logic id 3"):
        NpuSmiDriver(npu_smi).list_vnpus(3)


def test_config_recover(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim()
    driver = NpuSmiDriver(npu_smi)
    assert driver.config_recover_enabled()
    driver.set_config_recover(False)
    assert not sim.config_recover_enabled()
    assert not driver.config_recover_enabled()


def test_failing_query_keeps_the_driver_code(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim()
    sim.inject_failure("query", -8005)
    with pytest.raises(DriverFailure, match="exited with status 1") as caught:
        NpuSmiDriver(npu_smi).list_chips()
    assert caught.value.code == -8005


def test_vanished_vnpu_fails_the_listing(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.mark_vanished(100)
    with pytest.raises(DriverFailure) as caught:
        NpuSmiDriver(npu_smi).list_vnpus(0)
    assert caught.value.code == -8005


def test_injected_create_failure_with_no_cause_found(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim()
    sim.inject_failure("create", -8009, times=1)
    with pytest.raises(DriverFailure, match="create vNPU 100") as caught:
        NpuSmiDriver(npu_smi).create_vnpu(0, "vir05_1c_16g", 100)
    assert type(caught.value) is DriverFailure
    assert caught.value.code == -8009


def test_timeout(make_sim: MakeSim, npu_smi: str) -> None:
    sim = make_sim()
    sim.inject_slow("query", 5)
    start = time.monotonic()
    with pytest.raises(DriverFailure, match=r"info -m timed out after 0.5s"):
        NpuSmiDriver(npu_smi, timeout=0.5).list_chips()
    assert time.monotonic() - start < 3


def test_executable_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(DriverFailure, match="cannot run"):
        NpuSmiDriver(str(tmp_path / "npu-smi")).config_recover_enabled()


@pytest.mark.parametrize(
    ("setting", "call", "message"),
    [
        ("chip-list=empty", lambda d: d.list_chips(), "printed nothing"),
        ("chip-list=garbage", lambda d: d.list_chips(), "non-numeric"),
        ("info-vnpu=truncate", lambda d: d.list_vnpus(0), "rows but says|Total number"),
        ("info-vnpu=garbage", lambda d: d.list_chips(), "resource row"),
        ("template-info=truncate", lambda d: d.list_templates(0), "empty"),
        ("template-info=garbage", lambda d: d.list_templates(0), "unexpected line"),
        ("health=garbage", lambda d: d.list_chips(), None),
        ("vnpu-cfg-recover=truncate", lambda d: d.config_recover_enabled(), "nothing"),
        ("info-vnpu=empty", lambda d: d.list_vnpus(0), "printed nothing"),
        ("create-vnpu=empty", lambda d: d.create_vnpu(0, "vir05_1c_16g", 100), "no Status"),
        ("destroy-vnpu=garbage", lambda d: d.destroy_vnpu(0, 115), None),
    ],
)
def test_malformed_output_is_a_typed_error(
    make_sim: MakeSim,
    npu_smi: str,
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    call: Callable[[NpuSmiDriver], object],
    message: str | None,
) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 115)
    monkeypatch.setenv("NPU_SMI_FAKE_MALFORMED", setting)
    driver = NpuSmiDriver(npu_smi)
    if message is None:
        # Still readable after mangling: health "OK" has no digits; a
        # destroy's "Status : OK" neither. The call must simply succeed.
        call(driver)
        return
    with pytest.raises(MalformedOutputError, match=message):
        call(driver)


def test_setting_recover_mode_without_a_status_fails(
    make_sim: MakeSim, npu_smi: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_sim()
    monkeypatch.setenv("NPU_SMI_FAKE_MALFORMED", "vnpu-cfg-recover=empty")
    with pytest.raises(DriverFailure, match="disable config-recover mode failed"):
        NpuSmiDriver(npu_smi).set_config_recover(False)
