"""Typed driver errors and the driver factory."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from vnpu_agent.drivers import DRIVER_KINDS, Driver, make_driver
from vnpu_agent.drivers.base import (
    CapacityError,
    DriverError,
    DriverFailure,
    InUseError,
    InvalidIdError,
    InvalidTemplateError,
    MalformedOutputError,
    NotFoundError,
)
from vnpu_agent.drivers.diagnose import check_vnpu_id, error_for_code
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.drivers.sim.state import SimStateError
from vnpu_common.wire.models import _CONDITION_REASON_PATTERN

ALL_ERRORS = [
    CapacityError,
    InUseError,
    NotFoundError,
    InvalidTemplateError,
    InvalidIdError,
    DriverFailure,
    MalformedOutputError,
]


def test_message_carries_code_name_and_driver_text() -> None:
    err = CapacityError(
        "create vNPU 100 (vir10_3c_32g) on chip 0 failed",
        code=-8001,
        driver_message="check aicore num failed, phy_id:0, core_need:10, used:15, total:20",
    )
    assert str(err) == (
        "create vNPU 100 (vir10_3c_32g) on chip 0 failed (driver code -8001 INVALID_PARAMETER, "
        'driver said "check aicore num failed, phy_id:0, core_need:10, used:15, total:20")'
    )
    assert err.code == -8001
    assert err.driver_message.startswith("check aicore num failed")


def test_message_without_details_is_just_the_message() -> None:
    assert str(DriverFailure("list chips failed")) == "list chips failed"


def test_unknown_code_is_printed_as_a_number() -> None:
    assert "driver code -8999," in str(DriverFailure("x", code=-8999, driver_message="y"))


def test_multiline_driver_text_becomes_one_bounded_line() -> None:
    text = "Status : FAILED\n\n  Message : no\n" + "x" * 2000
    rendered = str(DriverFailure("create failed", driver_message=text))
    assert "\n" not in rendered
    assert "Status : FAILED; Message : no; xxx" in rendered
    assert len(rendered) < 700


@pytest.mark.parametrize("cls", ALL_ERRORS)
def test_errors_are_driver_errors_with_a_condition_reason(cls: type[DriverError]) -> None:
    import re

    assert issubclass(cls, DriverError)
    assert re.match(_CONDITION_REASON_PATTERN, cls.reason)


def test_malformed_output_is_a_driver_failure() -> None:
    assert issubclass(MalformedOutputError, DriverFailure)
    assert issubclass(SimStateError, DriverFailure)


@pytest.mark.parametrize("cls", ALL_ERRORS)
def test_errors_survive_pickling(cls: type[DriverError]) -> None:
    err = cls("boom", code=-8020, driver_message="busy")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (back.message, back.code, back.driver_message) == ("boom", -8020, "busy")
    assert str(back) == str(err)


@pytest.mark.parametrize(
    ("op", "code", "expected"),
    [
        ("create", -8020, CapacityError),
        ("destroy", -8020, InUseError),
        ("create", -8022, InvalidTemplateError),
        ("destroy", -8007, NotFoundError),
        ("query", -8008, NotFoundError),
        ("create", -8001, DriverFailure),
        ("query", -8005, DriverFailure),
        ("destroy", None, DriverFailure),
    ],
)
def test_code_table(op: str, code: int | None, expected: type[DriverError]) -> None:
    assert error_for_code(op, code) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [99, 1124, 65535, 0xFFFFFFFF, -1])
def test_ids_no_driver_accepts_are_refused_before_the_driver(bad: int) -> None:
    with pytest.raises(InvalidIdError, match=f"vNPU id {bad} is outside 100-1123"):
        check_vnpu_id(bad, "destroy")


def test_factory_builds_a_simulator(tmp_path: Path) -> None:
    driver = make_driver("sim", state_path=tmp_path / "s.json", layout="910B3=2")
    assert isinstance(driver, SimDriver)
    assert isinstance(driver, Driver)
    assert driver.name == "sim"
    assert len(driver.list_chips()) == 2


def test_factory_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError, match=r"unknown driver kind 'gpu'; use one of: sim, npu-smi"):
        make_driver("gpu")
    assert DRIVER_KINDS == ("sim", "npu-smi", "dcmi")


def test_factory_rejects_unknown_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"bad options for the sim driver.*it takes: state_path"):
        make_driver("sim", state_path=tmp_path / "s.json", chips="910B3=1")


def test_factory_builds_npu_smi_without_running_it() -> None:
    driver = make_driver("npu-smi", executable="/nonexistent/npu-smi", timeout=3)
    assert driver.name == "npu-smi"
    with pytest.raises(DriverFailure, match="cannot run /nonexistent/npu-smi info -m"):
        driver.list_chips()


def test_factory_reports_a_missing_dcmi_library() -> None:
    with pytest.raises(DriverFailure, match=r"cannot load DCMI library /nonexistent/libdcmi\.so"):
        make_driver("dcmi", library="/nonexistent/libdcmi.so")
