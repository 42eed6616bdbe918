"""The simulator's command line, as tests and humans run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localplane.sourceroots import pythonpath
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.drivers.sim.cli import main


def cli(state: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(["--state", str(state), *args])
    return code, json.loads(capsys.readouterr().out)


def test_module_entry_point(state_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vnpu_agent.drivers.sim",
            "--state",
            str(state_path),
            "init",
            "--chips",
            "910B3=1,310P3=1",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": pythonpath(), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr
    shown = json.loads(proc.stdout)
    assert [c["model"] for c in shown["chips"]] == ["910B3", "310P3"]


def test_a_session(state_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(state_path, "init", "--chips", "910B3=2", capsys=capsys)[0] == 0
    code, out = cli(state_path, "create", "0", "vir05_1c_16g", "--id", "100", capsys=capsys)
    assert (code, out) == (0, {"id": 100, "chip": 0, "template": "vir05_1c_16g", "in_use": False})
    assert cli(state_path, "create", "1", "vir10_3c_32g", capsys=capsys)[1]["id"] == 116
    assert cli(state_path, "open", "100", capsys=capsys)[1]["in_use"] is True
    code, out = cli(state_path, "destroy", "0", "100", capsys=capsys)
    assert code == 1
    assert out["error"]["type"] == "InUseError"
    assert out["error"]["code"] == -8001
    assert "vdev_id(100) is inused" in out["error"]["message"]
    assert cli(state_path, "release", "100", capsys=capsys)[1]["in_use"] is False
    code, out = cli(state_path, "destroy", "0", "100", capsys=capsys)
    assert code == 0
    assert [v["id"] for v in out["vnpus"]] == [116]
    assert cli(state_path, "reboot", capsys=capsys)[1] == {"replayed": [116], "skipped": []}
    assert cli(state_path, "recover", "off", capsys=capsys)[1]["config_recover"] is False
    assert cli(state_path, "show", capsys=capsys)[1]["boot_count"] == 1


def test_inject_and_clear(state_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim = SimDriver(state_path, "910B3=2")
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    cli(
        state_path,
        "inject",
        "fail",
        "create",
        "--code",
        "-8009",
        "--times",
        "2",
        "--after",
        capsys=capsys,
    )
    cli(state_path, "inject", "slow", "query", "1.5", capsys=capsys)
    cli(state_path, "inject", "unhealthy", "1", capsys=capsys)
    cli(state_path, "inject", "stuck", "100", capsys=capsys)
    code, out = cli(state_path, "inject", "vanish", "100", capsys=capsys)
    assert code == 0
    assert out["faults"] == {
        "failures": {"create": {"code": -8009, "times": 2, "after": True, "message": ""}},
        "slow": {"query": 1.5},
        "unhealthy_chips": [1],
        "stuck": [100],
        "vanished": [100],
    }
    code, out = cli(state_path, "clear-faults", capsys=capsys)
    assert out["faults"]["failures"] == {}
    assert out["faults"]["unhealthy_chips"] == []
    assert out["vnpus"][0]["in_use"] is True  # the container still has it open


def test_errors_are_json_with_exit_status_1(
    state_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(state_path, "show", capsys=capsys)
    assert code == 1
    assert out["error"]["reason"] == "SimulatorStateError"
    assert "give a chip layout" in out["error"]["message"]
    code, out = cli(state_path, "init", "--chips", "nope", capsys=capsys)
    assert code == 1
    assert "not MODEL=COUNT" in out["error"]["message"]
    SimDriver(state_path, "910B3=1")
    code, out = cli(state_path, "open", "100", capsys=capsys)
    assert (code, out["error"]["type"]) == (1, "NotFoundError")


def test_usage_errors_exit_2(state_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--state", str(state_path), "inject", "fail", "reboot"])
    assert caught.value.code == 2
