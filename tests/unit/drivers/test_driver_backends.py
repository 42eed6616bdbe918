"""The backends' table (vnpu_agent.drivers.backends) is the one list of
driver kinds: the agent's settings accept exactly its kinds, each row reads
settings the agent has, `vnpu-agent check` defaults to what the agent would
run with, and the agent builds each row's driver from its settings."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, get_args

import pytest

from vnpu_agent import check
from vnpu_agent.config import AgentSettings, DriverKind
from vnpu_agent.drivers import DRIVER_KINDS, DriverFailure
from vnpu_agent.drivers.backends import BACKENDS
from vnpu_agent.drivers.npu_smi import NpuSmiDriver
from vnpu_agent.main import build_driver


def test_the_settings_accept_exactly_the_tables_kinds() -> None:
    assert get_args(DriverKind) == DRIVER_KINDS == tuple(BACKENDS)
    for kind in DRIVER_KINDS:
        assert AgentSettings(node_name="n", driver=kind).driver == kind
    with pytest.raises(ValueError, match="driver"):
        AgentSettings(node_name="n", driver="gpu")  # type: ignore[arg-type]


def test_every_setting_a_row_reads_is_the_agents() -> None:
    fields = AgentSettings.model_fields
    for row in BACKENDS.values():
        read = set(row.settings) | {f.setting for f in row.check_flags if f.setting}
        assert read <= fields.keys(), (row.kind, read - fields.keys())
        if row.layout_setting is not None:
            assert row.layout_setting in row.settings


def test_check_defaults_to_what_the_agent_runs_with(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DRIVER", "DCMI_LIBRARY", "NPU_SMI_PATH", "DRIVER_TIMEOUT_SECONDS", "SIM_CHIPS"):
        monkeypatch.delenv(f"VNPU_{name}", raising=False)
    args = check._parser().parse_args([])
    agent = AgentSettings(node_name="n")
    assert (args.driver, args.dcmi_library, args.npu_smi_path, args.driver_timeout_seconds) == (
        agent.driver, agent.dcmi_library, agent.npu_smi_path, agent.driver_timeout_seconds
    )  # fmt: skip
    # The agent has no layout of its own (a node's annotation gives it); a
    # fresh check state needs one.
    assert (args.sim_state, args.sim_chips) == (None, "910B3=1")
    monkeypatch.setenv("VNPU_DRIVER_TIMEOUT_SECONDS", "7.5")
    monkeypatch.setenv("VNPU_NPU_SMI_PATH", "/opt/npu-smi")
    monkeypatch.setenv("VNPU_SIM_CHIPS", "310P3=2")
    args = check._parser().parse_args([])
    assert (args.driver_timeout_seconds, args.npu_smi_path, args.sim_chips) == (
        7.5, "/opt/npu-smi", "310P3=2"
    )  # fmt: skip


def _build(tmp_path: Path, **settings: Any) -> Any:
    s = AgentSettings(node_name="n1", state_dir=tmp_path, **settings)
    return asyncio.run(build_driver(s, None, "n1"))  # type: ignore[arg-type]


def test_the_agent_builds_each_rows_driver_from_its_settings(tmp_path: Path) -> None:
    """npu-smi and dcmi read no Node (the core API is None here)."""
    driver = _build(tmp_path, driver="npu-smi", npu_smi_path="/opt/npu-smi",
                    driver_timeout_seconds=4)  # fmt: skip
    assert isinstance(driver, NpuSmiDriver)
    assert (driver.executable, driver.timeout) == ("/opt/npu-smi", 4)
    with pytest.raises(DriverFailure, match=f"cannot load DCMI library {tmp_path}/nope.so"):
        _build(tmp_path, driver="dcmi", dcmi_library=str(tmp_path / "nope.so"))
    assert not (tmp_path / "n1").exists()
