"""Fixtures of the driver tests: simulator states, the fake npu-smi and the
DCMI stand-in compiled from tests/fakes/libdcmi_fake.c."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from vnpu_agent.drivers.sim import SimDriver

FAKES = Path(__file__).resolve().parents[2] / "fakes"

MakeSim = Callable[..., SimDriver]


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    node = tmp_path / "node"
    node.mkdir()
    return node / "state.json"


@pytest.fixture
def make_sim(state_path: Path) -> MakeSim:
    """SimDriver on this test's state file; the layout defaults to one 910B3."""

    def make(layout: Mapping[str, int] | str | None = "910B3=1") -> SimDriver:
        return SimDriver(state_path, layout)

    return make


@pytest.fixture
def npu_smi(state_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Path of the fake npu-smi, wired to this test's simulator state."""
    monkeypatch.setenv("NPU_SMI_FAKE_STATE", str(state_path))
    monkeypatch.setenv("NPU_SMI_FAKE_PYTHON", sys.executable)
    monkeypatch.delenv("NPU_SMI_FAKE_MALFORMED", raising=False)
    monkeypatch.delenv("NPU_SMI_FAKE_PHYID", raising=False)
    return str(FAKES / "npu-smi")


@pytest.fixture(scope="session")
def fake_dcmi_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed to build the DCMI stand-in (apt-get install gcc)")
    out = tmp_path_factory.mktemp("dcmi") / "libdcmi_fake.so"
    source = FAKES / "libdcmi_fake.c"
    build = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, f"building {source} failed:\n{build.stderr}"
    return out


@pytest.fixture
def dcmi_library(fake_dcmi_library: Path, state_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The compiled stand-in, wired to this test's simulator state."""
    helper = shlex.join([sys.executable, "-S", str(FAKES / "dcmi_fake_helper.py")])
    monkeypatch.setenv("VNPU_FAKE_DCMI_HELPER", helper)
    monkeypatch.setenv("VNPU_FAKE_DCMI_STATE", str(state_path))
    return str(fake_dcmi_library)
