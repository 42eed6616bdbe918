"""The agent's CDI specs against the rules of the CDI library containerd 2.2
reads them with (tags.cncf.io/container-device-interface v1.1.0: pkg/cdi
spec.go, device.go, container-edits.go, pkg/parser, specs-go/version.go),
and the setting that says where their host device nodes are.

The real-node test (tests/integration/test_real_node_cdi.py) has containerd
inject one; these check every rule that test would only find one at a time.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from vnpu_agent import cdi
from vnpu_agent.config import AgentSettings, parse_args

# specs-go/version.go: every version the library knows.
KNOWN_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0",
                  "1.0.0", "1.1.0")  # fmt: skip
# pkg/parser: vendor and class start with a letter, end with a letter or
# digit, with letters, digits, '_', '-', '.' between; a device name may also
# start with a digit and hold ':'.
VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
# specs-go/config.go field names; the library parses with UnmarshalStrict,
# so any other key fails the whole spec.
SPEC_KEYS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
DEVICE_KEYS = {"name", "annotations", "containerEdits"}
EDIT_KEYS = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"}
NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
MOUNT_KEYS = {"hostPath", "containerPath", "options", "type"}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def _minimum_version(spec: dict[str, Any]) -> str:
    """specs-go/version.go requiredVersion, for the features our specs can use."""
    devices = spec["devices"]
    if spec.get("annotations") or any(d.get("annotations") for d in devices):
        return "0.6.0"
    if "." in spec["kind"].split("/", 1)[1]:
        return "0.6.0"
    nodes = [n for d in devices for n in d["containerEdits"].get("deviceNodes", [])]
    if any(d["name"][0].isdigit() for d in devices) or any(n.get("hostPath") for n in nodes):
        return "0.5.0"
    return "0.3.0"


def check_spec(spec: dict[str, Any]) -> list[str]:
    """Every rule of the CDI library a spec of ours breaks (empty: it loads)."""
    problems: list[str] = []
    problems += [f"unknown spec field {k}" for k in set(spec) - SPEC_KEYS]
    version = spec.get("cdiVersion", "")
    if version not in KNOWN_VERSIONS:
        problems.append(f"invalid version {version!r}")
    elif _version(version) < _version(_minimum_version(spec)):
        problems.append(f"the spec version must be at least v{_minimum_version(spec)}")
    vendor, _, cls = spec.get("kind", "").partition("/")
    if not VENDOR_OR_CLASS.match(vendor) or not VENDOR_OR_CLASS.match(cls):
        problems.append(f"invalid kind {spec.get('kind')!r}")
    if not all(isinstance(v, str) for v in (spec.get("annotations") or {}).values()):
        problems.append("annotation values must be strings")
    devices = spec.get("devices") or []
    if not devices:
        problems.append("invalid spec, no devices")
    names = [d.get("name", "") for d in devices]
    if len(set(names)) != len(names):
        problems.append("invalid spec, multiple devices of one name")
    for device in devices:
        problems += [f"unknown device field {k}" for k in set(device) - DEVICE_KEYS]
        if not DEVICE_NAME.match(device.get("name", "")):
            problems.append(f"invalid device name {device.get('name')!r}")
        edits = device.get("containerEdits") or {}
        if not any(edits.values()):
            problems.append("invalid device, empty device edits")
        problems += [f"unknown edit field {k}" for k in set(edits) - EDIT_KEYS]
        problems += [f"invalid env {e!r}" for e in edits.get("env", []) if e.find("=") <= 0]
        for node in edits.get("deviceNodes", []):
            problems += [f"unknown device node field {k}" for k in set(node) - NODE_KEYS]
            if not node.get("path"):
                problems.append("invalid (empty) device path")
            if node.get("type", "") not in ("", "b", "c", "u", "p"):
                problems.append(f"device {node.get('path')}: invalid type")
        for mount in edits.get("mounts", []):
            problems += [f"unknown mount field {k}" for k in set(mount) - MOUNT_KEYS]
            # container-edits.go validateMounts: both paths set; the OCI spec
            # wants the container path absolute.
            if not mount.get("hostPath") or not str(mount.get("containerPath", "")).startswith("/"):
                problems.append(f"invalid mount {mount!r}")
    return problems


def _nodes(spec: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path of every device node of a one-device spec."""
    edits = spec["devices"][0]["containerEdits"]
    return {n["path"]: n["hostPath"] for n in edits["deviceNodes"]}


def test_the_spec_loads_under_the_cdi_librarys_rules(tmp_path: Path) -> None:
    path = cdi.write(tmp_path / "cdi", "n1", 117, "vir10_3c_32g")
    # The library reads only .json and .yaml files from its spec dirs.
    assert path.suffix == ".json"
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    spec = json.loads(path.read_text())
    assert check_spec(spec) == []
    assert _version(spec["cdiVersion"]) >= _version(_minimum_version(spec))


def test_the_checker_finds_what_the_library_refuses() -> None:
    """The rules above catch a broken spec, so an empty list means something."""
    spec = cdi.render(117, "vir10_3c_32g")
    broken = json.loads(json.dumps(spec))
    broken["cdiVersion"] = "0.4.0"
    broken["kind"] = "vnpu.io/-vnpu"
    broken["devices"][0]["name"] = "117/"
    broken["devices"][0]["containerEdits"]["env"].append("=x")
    broken["devices"][0]["containerEdits"]["deviceNodes"][0]["hostpath"] = "/dev/x"
    problems = check_spec(broken)
    assert problems == [
        "the spec version must be at least v0.6.0",
        "invalid kind 'vnpu.io/-vnpu'",
        "invalid device name '117/'",
        "invalid env '=x'",
        "unknown device node field hostpath",
    ]


def test_the_requesters_name_resolves_to_the_specs_device() -> None:
    """A requester (device plugin, DRA driver) names `<kind>=<device name>`;
    the library indexes devices by exactly that."""
    spec = cdi.render(1023, "vir05_1c_16g")
    qualified = f"{spec['kind']}={spec['devices'][0]['name']}"
    assert cdi.device_name(1023) == qualified == "vnpu.io/vnpu=1023"


def test_by_default_the_host_nodes_are_the_ascend_drivers_under_dev() -> None:
    spec = cdi.render(117, "vir10_3c_32g")
    assert _nodes(spec) == {
        "/dev/davinci117": "/dev/vdavinci117",
        "/dev/davinci_manager": "/dev/davinci_manager",
        "/dev/devmm_svm": "/dev/devmm_svm",
        "/dev/hisi_hdc": "/dev/hisi_hdc",
    }
    edits = spec["devices"][0]["containerEdits"]
    assert edits["env"] == ["ASCEND_VISIBLE_DEVICES=117", "ASCEND_RUNTIME_OPTIONS=VIRTUAL"]
    # No numbers of our own: the runtime stats the host node at injection
    # (the driver's major is not fixed), so no type/major/minor is written.
    assert all(set(n) == {"path", "hostPath"} for n in edits["deviceNodes"])
    assert spec["annotations"] == {"vnpu.io/template": "vir10_3c_32g"}


def test_a_host_device_dir_moves_the_host_paths_only(tmp_path: Path) -> None:
    dev = tmp_path / "sim-dev"
    path = cdi.write(tmp_path / "cdi", "n1", 205, "vir05_1c_16g", dev)
    spec = json.loads(path.read_text())
    assert _nodes(spec) == {
        "/dev/davinci205": str(dev / "vdavinci205"),
        "/dev/davinci_manager": str(dev / "davinci_manager"),
        "/dev/devmm_svm": str(dev / "devmm_svm"),
        "/dev/hisi_hdc": str(dev / "hisi_hdc"),
    }
    assert check_spec(spec) == []


def test_the_agent_setting_defaults_to_dev_and_takes_a_flag_or_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_args(["--node-name=n"]).cdi_host_device_dir == Path("/dev")
    monkeypatch.setenv("VNPU_CDI_HOST_DEVICE_DIR", "/var/lib/sim/dev")
    assert AgentSettings(node_name="n").cdi_host_device_dir == Path("/var/lib/sim/dev")
    flagged = parse_args(["--node-name=n", "--cdi-host-device-dir=/srv/dev"])
    assert flagged.cdi_host_device_dir == Path("/srv/dev")


def test_a_relative_host_device_dir_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--node-name=n", "--cdi-host-device-dir=dev"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--cdi-host-device-dir (VNPU_CDI_HOST_DEVICE_DIR): must be an absolute path" in err


def test_an_unchanged_spec_is_not_rewritten_and_a_changed_one_is(tmp_path: Path) -> None:
    path = cdi.write(tmp_path, "n1", 101, "vir05_1c_16g")
    first = path.stat()
    os.utime(path, ns=(first.st_atime_ns, first.st_mtime_ns - 10**9))
    marked = path.stat().st_mtime_ns
    assert cdi.write(tmp_path, "n1", 101, "vir05_1c_16g") == path
    assert path.stat().st_mtime_ns == marked  # left alone
    assert path.stat().st_ino == first.st_ino
    cdi.write(tmp_path, "n1", 101, "vir05_1c_16g", Path("/elsewhere"))
    assert "/elsewhere/vdavinci101" in path.read_text()
    path.write_text("{half a spec")
    cdi.write(tmp_path, "n1", 101, "vir05_1c_16g")
    assert json.loads(path.read_text()) == cdi.render(101, "vir05_1c_16g", cdi.HOST_DEVICE_DIR)
    assert not list(tmp_path.glob("*.tmp"))


# -- what a container holding claim devices sees (docs/DRA.md, "What the container sees") --

UID = "0b5c4a52-6d1e-4b5e-9d59-1f0c6ad0e001"


def _env(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


def test_a_non_first_vnpu_alone_is_index_0() -> None:
    """vNPU 116 (chip 1's first) in a container that holds only it: CANN calls it
    device 0, and ASCEND_RT_VISIBLE_DEVICES says so, whatever the image set."""
    spec = cdi.render_claim(UID, "npu-1-vir05-1c-16g-0", 116, "vir05_1c_16g")
    assert check_spec(spec) == []
    assert _env(spec) == {
        "ASCEND_VISIBLE_DEVICES": "116",
        "ASCEND_RUNTIME_OPTIONS": "VIRTUAL",
        "ASCEND_VNPU_SPECS": "",
        "ASCEND_RT_VISIBLE_DEVICES": "0",
    }


def test_every_device_of_a_request_carries_the_requests_env() -> None:
    """The CDI library keeps the last device's value of each variable: the same
    values on every device make the order the kubelet names them in moot."""
    ids = [116, 101, 117]
    specs = [cdi.render_claim(UID, f"d{i}", i, "vir05_1c_16g", request_ids=ids) for i in ids]
    envs = [_env(s) for s in specs]
    assert envs == [envs[0]] * 3
    # Ascending ids, so position k of the list is CANN's device k.
    assert envs[0]["ASCEND_VISIBLE_DEVICES"] == "101,116,117"
    assert envs[0]["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2"
    # Each still injects its own vNPU only.
    assert [_nodes(s)[f"/dev/davinci{i}"] for s, i in zip(specs, ids, strict=True)] == [
        f"/dev/vdavinci{i}" for i in ids
    ]
    assert all(len([p for p in _nodes(s) if p[-1].isdigit()]) == 1 for s in specs)


def test_the_vnpus_own_spec_names_no_index() -> None:
    """A requester of the user's own may name several vnpu.io/vnpu devices for one
    container; an index list on each would be the last one's and hide the others."""
    assert "ASCEND_RT_VISIBLE_DEVICES" not in _env(cdi.render(116, "vir05_1c_16g"))


def test_the_metadata_mount_is_read_only_and_loads(tmp_path: Path) -> None:
    host = tmp_path / "team-a_c" / "npu" / "metadata.json"
    mount = cdi.metadata_mount(
        host,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/npu/vnpu.io-metadata.json",
    )
    path = cdi.write_claim(tmp_path / "cdi", UID, "npu-0-vir05-1c-16g-0", 100, "vir05_1c_16g",
                           metadata=mount)  # fmt: skip
    spec = json.loads(path.read_text())
    assert check_spec(spec) == []
    (got,) = spec["devices"][0]["containerEdits"]["mounts"]
    assert got == {
        "hostPath": str(host),
        "containerPath": (
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/npu/vnpu.io-metadata.json"
        ),
        "options": ["ro", "bind"],
    }
    broken = json.loads(json.dumps(spec))
    broken["devices"][0]["containerEdits"]["mounts"][0]["containerPath"] = "relative"
    assert check_spec(broken) == [
        f"invalid mount {broken['devices'][0]['containerEdits']['mounts'][0]!r}"
    ]
