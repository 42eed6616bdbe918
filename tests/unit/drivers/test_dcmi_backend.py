"""The dcmi backend end to end against the C stand-in compiled from
tests/fakes/libdcmi_fake.c, backed by the simulator's state."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

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
    NotFoundError,
)
from vnpu_agent.drivers.dcmi import DcmiDriver, _Device
from vnpu_agent.drivers.sim import SimDriver

MakeSim = Callable[..., SimDriver]


def test_inventory_matches_the_simulator(make_sim: MakeSim, dcmi_library: str) -> None:
    sim = make_sim("910B4=1,310P3=1")
    sim.create_vnpu(1, "vir02", 117)
    sim.set_chip_health(0, False)
    driver = DcmiDriver(dcmi_library)
    assert isinstance(driver, Driver)
    assert driver.list_chips() == sim.list_chips()
    assert driver.list_templates(1) == sim.list_templates(1)
    assert driver.list_vnpus(1) == [VNPU(117, 1, "vir02", False)]


def test_create_list_destroy(make_sim: MakeSim, dcmi_library: str) -> None:
    sim = make_sim()
    driver = DcmiDriver(dcmi_library)
    assert driver.create_vnpu(0, "vir05_1c_16g", 102) == VNPU(102, 0, "vir05_1c_16g", False)
    assert driver.create_vnpu(0, "vir10_3c_32g", ANY_VNPU_ID).id == 100
    sim.open_vnpu(102)
    assert driver.list_vnpus(0) == [
        VNPU(100, 0, "vir10_3c_32g", False),
        VNPU(102, 0, "vir05_1c_16g", True),
    ]
    with pytest.raises(InUseError, match="vNPU 102 is in use") as caught:
        driver.destroy_vnpu(0, 102)
    assert caught.value.code == -8001
    assert caught.value.driver_message == "dcmi_set_destroy_vdevice returned -8001"
    sim.release_vnpu(102)
    driver.destroy_vnpu(0, 102)
    driver.destroy_vnpu(0, 100)
    assert sim.list_vnpus(0) == []
    with pytest.raises(NotFoundError, match="chip 0 has no vNPU 100"):
        driver.destroy_vnpu(0, 100)


def test_create_failures_are_named(make_sim: MakeSim, dcmi_library: str) -> None:
    sim = make_sim("910B4=2")
    sim.create_vnpu(0, "vir10_3c_16g", 100)
    driver = DcmiDriver(dcmi_library)
    with pytest.raises(CapacityError, match="not enough media units on chip 0") as caught:
        driver.create_vnpu(0, "vir10_4c_16g_m", 101)
    assert caught.value.code == -8001
    with pytest.raises(InvalidIdError, match="already taken"):
        driver.create_vnpu(0, "vir05_1c_8g", 100)
    with pytest.raises(InvalidIdError, match="outside chip 1's range 116-131"):
        driver.create_vnpu(1, "vir05_1c_8g", 100)
    with pytest.raises(InvalidTemplateError, match="offers no template 'vir01'"):
        driver.create_vnpu(1, "vir01", 116)
    assert [v.id for v in sim.list_vnpus(0)] == [100]


def test_refuses_ids_dcmi_would_misread(make_sim: MakeSim, dcmi_library: str) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    driver = DcmiDriver(dcmi_library)
    with pytest.raises(InvalidIdError, match="outside 100-1123"):
        driver.destroy_vnpu(0, 65535)  # DCMI: "destroy every vNPU of the device"
    with pytest.raises(InvalidIdError):
        driver.create_vnpu(0, "vir05_1c_16g", 99)
    assert len(sim.list_vnpus(0)) == 1


def test_template_names_that_do_not_fit_the_struct(make_sim: MakeSim, dcmi_library: str) -> None:
    make_sim()
    with pytest.raises(InvalidTemplateError, match="not valid"):
        DcmiDriver(dcmi_library).create_vnpu(0, "vir05_" + "x" * 40, 100)


def test_config_recover(make_sim: MakeSim, dcmi_library: str) -> None:
    sim = make_sim()
    driver = DcmiDriver(dcmi_library)
    assert driver.config_recover_enabled()
    driver.set_config_recover(False)
    assert not sim.config_recover_enabled()
    assert not driver.config_recover_enabled()


def test_vanished_vnpu_fails_the_listing_with_8005(make_sim: MakeSim, dcmi_library: str) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.mark_vanished(100)
    driver = DcmiDriver(dcmi_library)
    with pytest.raises(DriverFailure, match="query vNPU 100 of chip 0 failed") as caught:
        driver.list_vnpus(0)
    assert caught.value.code == -8005
    driver.destroy_vnpu(0, 100)
    assert driver.list_vnpus(0) == []


def test_failing_queries_and_creates(make_sim: MakeSim, dcmi_library: str) -> None:
    sim = make_sim()
    driver = DcmiDriver(dcmi_library)
    sim.inject_failure("query", -8009, times=1)
    with pytest.raises(DriverFailure) as query:
        driver.list_chips()
    assert query.value.code == -8009
    sim.inject_failure("create", -8020, times=1)
    with pytest.raises(CapacityError) as create:  # code table: no cause found on the chip
        driver.create_vnpu(0, "vir05_1c_16g", 100)
    assert create.value.code == -8020
    assert sim.list_vnpus(0) == []


def test_unknown_chip(make_sim: MakeSim, dcmi_library: str) -> None:
    make_sim()
    with pytest.raises(NotFoundError, match="no chip with logic id 2"):
        DcmiDriver(dcmi_library).list_templates(2)


def test_init_failure_is_reported(make_sim: MakeSim, dcmi_library: str) -> None:
    make_sim().inject_failure("query", -8005)
    with pytest.raises(DriverFailure, match="initialise DCMI failed") as caught:
        DcmiDriver(dcmi_library)
    assert caught.value.code == -8005


def test_chip_model_without_a_catalog(
    make_sim: MakeSim, dcmi_library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_sim()
    driver = DcmiDriver(dcmi_library)
    monkeypatch.setattr(driver, "_devices", [_Device(0, 0, 0, 0, "999X")])
    with pytest.raises(DriverFailure, match="no template catalog for chip model '999X'"):
        driver.list_templates(0)


def test_a_library_without_dcmi() -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None
    with pytest.raises(DriverFailure, match="lacks dcmi_init"):
        DcmiDriver(libc)
