"""`vnpu-agent check`, the hardware self-check (vnpu_agent.check), against the
three backends' stand-ins: the simulator, the fake npu-smi and the DCMI
stand-in, all on one simulator state. A match exits 0 with a table; a
model the catalog lacks, template sizes that differ from it and a driver
that does not load exit non-zero saying so."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from vnpu_agent.drivers import catalog
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.main import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["check", *argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.fixture
def node(state_path: Path) -> SimDriver:
    """Two 910B3 and a 310P3, one vNPU already on chip 0, in use."""
    sim = SimDriver(state_path, "910B3=2,310P3=1")
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.open_vnpu(100)
    return sim


def _backend(kind: str, state_path: Path, npu_smi: str | None, dcmi: str | None) -> list[str]:
    if kind == "sim":
        return ["--driver", "sim", "--sim-state", str(state_path)]
    if kind == "npu-smi":
        assert npu_smi is not None
        return ["--driver", "npu-smi", "--npu-smi-path", npu_smi]
    assert dcmi is not None
    return ["--driver", "dcmi", "--dcmi-library", dcmi]


@pytest.fixture(params=["sim", "npu-smi", "dcmi"])
def backend(request: pytest.FixtureRequest, state_path: Path, node: SimDriver) -> list[str]:
    kind = request.param
    npu_smi = request.getfixturevalue("npu_smi") if kind == "npu-smi" else None
    dcmi = request.getfixturevalue("dcmi_library") if kind == "dcmi" else None
    return _backend(kind, state_path, npu_smi, dcmi)


def test_a_node_that_matches_the_catalog_passes_with_a_table(
    backend: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _run(capsys, *backend)
    assert rc == 0, out
    assert "3 chip(s)" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("CHIP  PHY"))
    assert "TEMPLATES" in header
    assert any(line.split()[:4] == ["0", "0", "910B3", "910B3"] for line in lines), out
    assert any(line.split()[:4] == ["2", "2", "310P3", "310P3"] for line in lines), out
    assert any(line.split() == ["0", "100", "vir05_1c_16g", "yes"] for line in lines), out
    assert "OK: every chip's model and templates match the catalog" in out


def test_template_sizes_that_differ_from_the_catalog_fail(
    state_path: Path, node: SimDriver, npu_smi: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """npu-smi reads the templates from the driver (here the stand-in, which
    keeps the real catalog); this process's catalog is made to disagree."""
    model = catalog.CATALOG["910B3"]
    bigger = tuple(replace(t, aicore=6) if t.name == "vir05_1c_16g" else t for t in model.templates)
    monkeypatch.setitem(catalog.CATALOG, "910B3", replace(model, templates=bigger))
    rc, out = _run(capsys, "--driver", "npu-smi", "--npu-smi-path", npu_smi)
    assert rc == 1, out
    assert (
        "MISMATCH: chip 0 (910B3): template vir05_1c_16g is 5 AICore, 16384 MB, 1 AICPU, "
        "2 media in the driver, 6 AICore, 16384 MB, 1 AICPU, 2 media in the catalog"
    ) in out
    assert "FAIL: 2 mismatch(es) with the catalog" in out


@pytest.mark.parametrize("kind", ["npu-smi", "dcmi"])
def test_a_model_the_catalog_lacks_fails(
    kind: str, state_path: Path, node: SimDriver, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    npu_smi = request.getfixturevalue("npu_smi") if kind == "npu-smi" else None
    dcmi = request.getfixturevalue("dcmi_library") if kind == "dcmi" else None
    monkeypatch.delitem(catalog.CATALOG, "310P3")
    rc, out = _run(capsys, *_backend(kind, state_path, npu_smi, dcmi))
    assert rc == 1, out
    assert "MISMATCH: chip 2 (310P3): model '310P3' is not in the catalog (known: " in out
    assert "the operator places nothing on it" in out
    assert "MISMATCH: chip 0" not in out


def test_a_driver_that_does_not_load_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _run(capsys, "--driver", "dcmi", "--dcmi-library", str(tmp_path / "libdcmi.so"))
    assert rc == 2
    assert f"FAIL: cannot load the dcmi driver: cannot load DCMI library {tmp_path}" in out
    rc, out = _run(capsys, "--driver", "npu-smi", "--npu-smi-path", str(tmp_path / "npu-smi"))
    assert rc == 2
    assert "FAIL: the npu-smi driver did not answer" in out


def test_the_driver_and_its_paths_come_from_the_agents_variables(
    state_path: Path, node: SimDriver, dcmi_library: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Run in the agent's pod (kubectl exec ... -- vnpu-agent check) it checks
    what the agent runs with."""
    monkeypatch.setenv("VNPU_DRIVER", "dcmi")
    monkeypatch.setenv("VNPU_DCMI_LIBRARY", dcmi_library)
    rc, out = _run(capsys)
    assert rc == 0, out
    assert out.startswith("driver dcmi: 3 chip(s)")
