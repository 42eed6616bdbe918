"""The simulator's device nodes (--sim-device-dir): one character device per
vNPU, named as the real driver names it on the host, there exactly while the
vNPU exists."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vnpu_agent.config import AgentSettings
from vnpu_agent.drivers.sim import NULL_DEVICE, SimDriver


def _nodes(directory: Path) -> dict[str, tuple[int, int]]:
    """name -> (major, minor) of every character device in `directory`."""
    out = {}
    for entry in directory.iterdir():
        st = entry.lstat()
        assert stat.S_ISCHR(st.st_mode), f"{entry} is not a character device"
        out[entry.name] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out


@pytest.fixture
def devices(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail("mknod needs root (CAP_MKNOD): run the unit tests as root")
    return tmp_path / "dev"


def test_create_and_destroy_make_and_remove_the_node(tmp_path: Path, devices: Path) -> None:
    sim = SimDriver(tmp_path / "state.json", "910B3=2", device_dir=devices)
    sim.create_vnpu(0, "vir05_1c_16g", 101)
    sim.create_vnpu(1, "vir05_1c_16g", 117)
    assert _nodes(devices) == {"vdavinci101": NULL_DEVICE, "vdavinci117": NULL_DEVICE}
    assert stat.S_IMODE((devices / "vdavinci101").stat().st_mode) == 0o666
    assert sim.device_node(101) == devices / "vdavinci101"

    sim.destroy_vnpu(0, 101)
    assert _nodes(devices) == {"vdavinci117": NULL_DEVICE}


def test_a_refused_create_or_destroy_leaves_the_nodes_alone(tmp_path: Path, devices: Path) -> None:
    sim = SimDriver(tmp_path / "state.json", "910B3=1", device_dir=devices)
    sim.create_vnpu(0, "vir10_3c_32g", 100)
    sim.create_vnpu(0, "vir10_3c_32g", 101)
    with pytest.raises(Exception, match="aicore"):
        sim.create_vnpu(0, "vir05_1c_16g", 102)
    sim.open_vnpu(100)
    with pytest.raises(Exception, match="in use"):
        sim.destroy_vnpu(0, 100)
    assert set(_nodes(devices)) == {"vdavinci100", "vdavinci101"}


def test_reboot_removes_nodes_and_makes_those_it_replays(tmp_path: Path, devices: Path) -> None:
    sim = SimDriver(tmp_path / "state.json", "910B3=1", device_dir=devices)
    sim.set_config_recover(True)
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.set_config_recover(False)
    sim.create_vnpu(0, "vir05_1c_16g", 101)
    sim.set_config_recover(True)
    sim.reboot()
    # Only 100 was created while recover was on, so only it comes back.
    assert set(_nodes(devices)) == {"vdavinci100"}


def test_without_a_device_dir_no_node_is_made(tmp_path: Path) -> None:
    sim = SimDriver(tmp_path / "state.json", "910B3=1")
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    assert sim.device_node(100) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "state.json",
        "state.json.lock",
        "vnpu.cfg",
    ]


def test_the_setting_serves_one_sim_node_only(tmp_path: Path) -> None:
    ok = AgentSettings(node_name="n1", driver="sim", sim_device_dir=tmp_path)
    assert ok.sim_device_dir == tmp_path
    with pytest.raises(ValueError, match="exactly one node"):
        AgentSettings(simulate_nodes=["n1", "n2"], sim_device_dir=tmp_path)
    with pytest.raises(ValueError, match="exactly one node"):
        AgentSettings(node_name="n1", driver="dcmi", sim_device_dir=tmp_path)
