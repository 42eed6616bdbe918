"""The Ascend Docker Runtime stand-in (hack/localplane/ascend_runtime.py): which
devices it adds to a create's config.json, what it refuses, and that it hands
every command to runc unchanged."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localplane import ascend_runtime as rt
from vnpu_agent.drivers.sim import NULL_DEVICE
from vnpu_common.wire import names


@pytest.fixture
def devdir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail("mknod needs root (CAP_MKNOD): run the unit tests as root")
    d = tmp_path / "dev"
    d.mkdir()
    for name in ("vdavinci101", "vdavinci117", "vdavinci130", "davinci_manager"):
        os.mknod(d / name, stat.S_IFCHR | 0o666, os.makedev(*NULL_DEVICE))
        os.chmod(d / name, 0o666)  # past the umask
    return d


def _spec(*env: str) -> dict[str, Any]:
    return {"process": {"env": ["PATH=/bin", *env]}, "linux": {"resources": {"devices": []}}}


def test_names_agree_with_the_product() -> None:
    assert rt.ENV_VISIBLE_DEVICES == names.ENV_VISIBLE_DEVICES
    assert rt.ENV_RUNTIME_OPTIONS == names.ENV_RUNTIME_OPTIONS
    assert rt.VIRTUAL == names.RUNTIME_OPTIONS_VIRTUAL
    assert (rt.VNPU_ID_MIN, rt.VNPU_ID_MAX) == (names.VNPU_ID_MIN, names.VNPU_ID_MAX)
    assert Path(names.device_path(101)).name == "vdavinci101"


def test_exactly_the_listed_vnpus_and_present_control_devices_are_added(devdir: Path) -> None:
    spec = _spec("ASCEND_VISIBLE_DEVICES=117,101", "ASCEND_RUNTIME_OPTIONS=VIRTUAL")
    added = rt.add_devices(spec, devdir)
    assert added == ["/dev/davinci117", "/dev/davinci101", "/dev/davinci_manager"]
    assert spec["linux"]["devices"][0] == {
        "path": "/dev/davinci117", "type": "c", "major": 1, "minor": 3,
        "fileMode": 0o666, "uid": 0, "gid": 0,
    }  # fmt: skip
    assert (
        spec["linux"]["resources"]["devices"]
        == [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}] * 3
    )
    # vNPU 130 exists on the host but was not asked for.
    assert "/dev/davinci130" not in {d["path"] for d in spec["linux"]["devices"]}


@pytest.mark.parametrize(
    "env",
    [
        (),
        ("ASCEND_VISIBLE_DEVICES=101",),
        ("ASCEND_VISIBLE_DEVICES=101", "ASCEND_RUNTIME_OPTIONS=NODRV"),
        ("ASCEND_RUNTIME_OPTIONS=VIRTUAL",),
        # Empty: the list the webhook gives a container without vNPUs.
        ("ASCEND_VISIBLE_DEVICES=", "ASCEND_RUNTIME_OPTIONS=VIRTUAL"),
        # The last occurrence wins: an image's value overridden by the pod's.
        ("ASCEND_VISIBLE_DEVICES=101", "ASCEND_RUNTIME_OPTIONS=VIRTUAL", "ASCEND_VISIBLE_DEVICES="),
        ("ASCEND_VNPU_SPECS=", "ASCEND_RUNTIME_OPTIONS=VIRTUAL", "ASCEND_VISIBLE_DEVICES="),
    ],
)
def test_nothing_is_added_unless_both_variables_ask(devdir: Path, env: tuple[str, ...]) -> None:
    spec = _spec(*env)
    assert rt.add_devices(spec, devdir) == []
    assert "devices" not in spec["linux"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("101,x", "'x' is not a vNPU id"),
        ("101,", "'' is not a vNPU id"),
        ("99", "outside 100..1123"),
        ("102", "vNPU 102, but its device"),
    ],
)
def test_bad_or_unknown_ids_are_refused(devdir: Path, value: str, message: str) -> None:
    spec = _spec(f"ASCEND_VISIBLE_DEVICES={value}", "ASCEND_RUNTIME_OPTIONS=VIRTUAL")
    with pytest.raises(rt.StandInError, match=message):
        rt.add_devices(spec, devdir)


def test_devices_cdi_added_first_are_added_again_and_the_env_is_left_alone(
    devdir: Path,
) -> None:
    """A DRA container: containerd applied the claim's CDI spec (device node, env)
    before the runtime runs. The real runtime's addDeviceToSpec appends without
    looking, and reads none of CANN's variables; so does the stand-in."""
    env = ("ASCEND_VISIBLE_DEVICES=117,101", "ASCEND_RUNTIME_OPTIONS=VIRTUAL",
           "ASCEND_VNPU_SPECS=", "ASCEND_RT_VISIBLE_DEVICES=0,1")  # fmt: skip
    spec = _spec(*env)
    cdi_node = {"path": "/dev/davinci117", "type": "c", "major": 1, "minor": 3}
    spec["linux"]["devices"] = [dict(cdi_node)]
    added = rt.add_devices(spec, devdir)
    assert added == ["/dev/davinci117", "/dev/davinci101", "/dev/davinci_manager"]
    paths = [d["path"] for d in spec["linux"]["devices"]]
    assert paths == ["/dev/davinci117", *added]
    assert spec["process"]["env"] == ["PATH=/bin", *env]


def test_the_last_occurrence_wins_whoever_wrote_it(devdir: Path) -> None:
    # Image ENV first, the pod's env after it: the runtime takes the later one.
    spec = _spec("ASCEND_VISIBLE_DEVICES=", "ASCEND_RUNTIME_OPTIONS=VIRTUAL",
                 "ASCEND_VISIBLE_DEVICES=130")  # fmt: skip
    assert rt.add_devices(spec, devdir)[0] == "/dev/davinci130"


@pytest.mark.parametrize("specs_first", [False, True])
def test_vnpu_specs_make_the_runtime_create_a_vnpu_behind_the_ledger(
    devdir: Path, specs_first: bool
) -> None:
    """Without VIRTUAL both modes create; under VIRTUAL only the CDI mode's order."""
    spec = _spec("ASCEND_VNPU_SPECS=vir05_1c_16g", "ASCEND_VISIBLE_DEVICES=0")
    added = rt.add_devices(spec, devdir, specs_first)
    # 100 is the first id without a device node in devdir.
    assert added == ["/dev/davinci100", "/dev/davinci_manager"]
    assert stat.S_ISCHR((devdir / "vdavinci100").stat().st_mode)
    assert (devdir / rt.CREATED_LOG).read_text() == "100 vir05_1c_16g\n"

    virtual = _spec("ASCEND_VNPU_SPECS=vir05_1c_16g", "ASCEND_RUNTIME_OPTIONS=VIRTUAL")
    added = rt.add_devices(virtual, devdir, specs_first)
    assert added == (["/dev/davinci102", "/dev/davinci_manager"] if specs_first else [])
    # Emptied by a later entry (what the webhook writes), nothing is created.
    emptied = _spec("ASCEND_VNPU_SPECS=vir05_1c_16g", "ASCEND_VNPU_SPECS=")
    assert rt.add_devices(emptied, devdir, specs_first) == []
    assert len((devdir / rt.CREATED_LOG).read_text().splitlines()) == (2 if specs_first else 1)


def test_the_command_is_found_past_runc_global_options() -> None:
    argv = ["--root", "/r", "--log=/l.json", "--log-format", "json", "--systemd-cgroup",
            "create", "--bundle", "/b", "id1"]  # fmt: skip
    index, options = rt.split_command(argv)
    assert argv[index] == "create"
    assert options == {"--root": "/r", "--log": "/l.json", "--log-format": "json"}
    assert rt.bundle_of(argv[index + 1 :]) == Path("/b")
    assert rt.bundle_of(["--bundle=/c", "id"]) == Path("/c")


def _run(tmp_path: Path, devdir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The stand-in as the runc shim runs it, with a fake runc that records its arguments."""
    fake = tmp_path / "runc"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "runc.args"}\n')
    fake.chmod(0o755)
    env = {**os.environ, "VNPU_STANDIN_RUNC": str(fake), "VNPU_STANDIN_DEVICE_DIR": str(devdir)}
    return subprocess.run(
        [sys.executable, rt.__file__, *argv], env=env, capture_output=True, text=True, check=False
    )


def test_create_rewrites_the_bundle_then_execs_runc(tmp_path: Path, devdir: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps(_spec("ASCEND_VISIBLE_DEVICES=101", "ASCEND_RUNTIME_OPTIONS=VIRTUAL"))
    )
    out = _run(tmp_path, devdir, "--root", "/r", "create", "--bundle", str(bundle), "c1")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "runc.args").read_text().split() == [
        "--root", "/r", "create", "--bundle", str(bundle), "c1"
    ]  # fmt: skip
    spec = json.loads((bundle / "config.json").read_text())
    assert [d["path"] for d in spec["linux"]["devices"]] == [
        "/dev/davinci101",
        "/dev/davinci_manager",
    ]


def test_other_commands_pass_straight_through(tmp_path: Path, devdir: Path) -> None:
    out = _run(tmp_path, devdir, "--root", "/r", "kill", "c1", "9")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "runc.args").read_text().split() == ["--root", "/r", "kill", "c1", "9"]


def test_a_refused_create_says_why_in_runc_log_and_never_runs_runc(
    tmp_path: Path, devdir: Path
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps(_spec("ASCEND_VISIBLE_DEVICES=105", "ASCEND_RUNTIME_OPTIONS=VIRTUAL"))
    )
    log = tmp_path / "log.json"
    out = _run(tmp_path, devdir, "--log", str(log), "create", "-b", str(bundle), "c1")
    assert out.returncode == 1
    assert "vNPU 105, but its device" in out.stderr
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error"
    assert "vNPU 105" in entry["msg"]
    assert not (tmp_path / "runc.args").exists()
