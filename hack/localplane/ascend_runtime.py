#!/usr/bin/env python3
"""A stand-in for Ascend Docker Runtime: an OCI runtime wrapping runc.

Like the real runtime, on `create` it reads the bundle's config.json, the
container's final environment (image ENV, then what the kubelet adds; for a
name set twice the last occurrence wins), checks neither privilege, nor
annotations, nor the RuntimeClass, and, when that environment has
`ASCEND_VISIBLE_DEVICES` and `ASCEND_RUNTIME_OPTIONS` contains `VIRTUAL`, adds
each listed vNPU to the container (an empty list adds nothing): host node
`<device dir>/vdavinci<id>` appears in the container as `/dev/davinci<id>`
(docs/ASCEND.md), with a `linux.devices` entry and a device cgroup allow rule
carrying the host node's type, major and minor. The control devices the real
runtime adds (`davinci_manager`, `devmm_svm`, `hisi_hdc`) are added too when
they exist in the device dir. Like the real runtime it appends an entry the
spec already has (CDI's, on a DRA node) and leaves every other variable,
ASCEND_RT_VISIBLE_DEVICES among them, as it found it. Then it execs the real
runc with the same arguments; every other command passes straight through.

An id that is not a number, lies outside 100..1123 or has no device node
fails the create: the message goes to stderr and, as a JSON error line, to
runc's `--log` file, which is where containerd's runc shim reads the reason
it reports (so it shows up in the container's status).

`ASCEND_VNPU_SPECS=<template>` makes it create a vNPU itself, as the real
runtime's `CreateVDevice` does, behind every ledger: a new device node at the
first free id, logged to `<device dir>/runtime-created.log`, and added to the
container. The real runtime skips that under `VIRTUAL`, except in its CDI
injection mode, which tries the create first; `VNPU_STANDIN_SPECS_FIRST=1`
behaves as that mode (the real node runs it so, the worse case).

What it does not do: the real runtime's prestart hook also mounts the
driver's libraries and tools (npu-smi, libdcmi) into the container; nothing
here needs them.

Settings come from the environment, so that containerd's `BinaryName` can
name a one-line wrapper: `VNPU_STANDIN_RUNC` (the real runc; default `runc`
on PATH), `VNPU_STANDIN_DEVICE_DIR` (host device nodes; default /dev) and
`VNPU_STANDIN_SPECS_FIRST`.
Standard library only: the runc shim runs it with whatever Python the
wrapper names, outside the project's environment.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

ENV_VISIBLE_DEVICES = "ASCEND_VISIBLE_DEVICES"
ENV_RUNTIME_OPTIONS = "ASCEND_RUNTIME_OPTIONS"
ENV_VNPU_SPECS = "ASCEND_VNPU_SPECS"
CREATED_LOG = "runtime-created.log"
# The sim driver's device number for a vNPU node (vnpu_agent.drivers.sim.NULL_DEVICE).
NULL_DEVICE = (1, 3)
VIRTUAL = "VIRTUAL"
VNPU_ID_MIN = 100
VNPU_ID_MAX = 1123
CONTROL_DEVICES = ("davinci_manager", "devmm_svm", "hisi_hdc")

# runc's global options that take a value (`runc --help`); the command is the
# first argument that is neither one of these nor their value.
_GLOBAL_WITH_VALUE = frozenset({"--root", "--log", "--log-format", "--criu", "--rootless"})


class StandInError(Exception):
    """The create cannot go on; the message says why, for the container's status."""


def split_command(argv: list[str]) -> tuple[int, dict[str, str]]:
    """Index of the runc command in `argv` (-1 if none) and the global
    options that take a value, e.g. {"--log": "/run/.../log.json"}."""
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            return i, options
        name, eq, value = arg.partition("=")
        if name in _GLOBAL_WITH_VALUE and not eq:
            if i + 1 < len(argv):
                options[name] = argv[i + 1]
            i += 2
            continue
        if eq:
            options[name] = value
        i += 1
    return -1, options


def bundle_of(args: list[str]) -> Path:
    """The `--bundle`/`-b` of a `create`'s own arguments; runc's default is the cwd."""
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--bundle="):
            return Path(arg.split("=", 1)[1])
    return Path.cwd()


def final_env(env: list[str]) -> dict[str, str]:
    """The environment as the runtime reads it: for a name set twice, the last
    occurrence wins (the real runtime scans from the end)."""
    values: dict[str, str] = {}
    for entry in env:
        key, _, value = entry.partition("=")
        values[key] = value
    return values


def _virtual(values: dict[str, str]) -> bool:
    return VIRTUAL in {o.strip() for o in values.get(ENV_RUNTIME_OPTIONS, "").split(",")}


def visible_ids(env: list[str]) -> list[int] | None:
    """The vNPU ids the process environment asks for; None when the runtime
    has nothing to do (no ASCEND_VISIBLE_DEVICES, or not VIRTUAL)."""
    values = final_env(env)
    if ENV_VISIBLE_DEVICES not in values or not _virtual(values):
        return None
    raw = values[ENV_VISIBLE_DEVICES]
    if not raw.strip():
        return []
    ids: list[int] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part.isdigit():
            raise StandInError(
                f"{ENV_VISIBLE_DEVICES}={raw!r}: {part!r} is not a vNPU id "
                f"(a comma list of ids {VNPU_ID_MIN}..{VNPU_ID_MAX} is expected)"
            )
        vnpu_id = int(part)
        if not VNPU_ID_MIN <= vnpu_id <= VNPU_ID_MAX:
            raise StandInError(
                f"{ENV_VISIBLE_DEVICES}={raw!r}: vNPU id {vnpu_id} is outside "
                f"{VNPU_ID_MIN}..{VNPU_ID_MAX}"
            )
        if vnpu_id not in ids:
            ids.append(vnpu_id)
    return ids


def _device(host: Path, container_path: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    try:
        st = host.stat()
    except FileNotFoundError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        raise StandInError(f"{host} is not a device node")
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    entry = {
        "path": container_path,
        "type": kind,
        "major": major,
        "minor": minor,
        "fileMode": stat.S_IMODE(st.st_mode),
        "uid": 0,
        "gid": 0,
    }
    rule = {"allow": True, "type": kind, "major": major, "minor": minor, "access": "rwm"}
    return entry, rule


def create_for_specs(env: list[str], device_dir: Path, specs_first: bool) -> int | None:
    """The id of the vNPU the runtime creates itself for ASCEND_VNPU_SPECS, or None.
    Under VIRTUAL only `specs_first` (the CDI mode's order) still creates."""
    values = final_env(env)
    template = values.get(ENV_VNPU_SPECS, "").strip()
    if not template or (_virtual(values) and not specs_first):
        return None
    for vnpu_id in range(VNPU_ID_MIN, VNPU_ID_MAX + 1):
        node = device_dir / f"vdavinci{vnpu_id}"
        if node.exists():
            continue
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(*NULL_DEVICE))
        os.chmod(node, 0o666)
        with open(device_dir / CREATED_LOG, "a", encoding="utf-8") as log:
            log.write(f"{vnpu_id} {template}\n")
        return vnpu_id
    raise StandInError(f"{ENV_VNPU_SPECS}={template!r}: no free vNPU id left")


def add_devices(spec: dict[str, Any], device_dir: Path, specs_first: bool = False) -> list[str]:
    """Adds the vNPUs the spec's process asks for (and one the runtime creates for
    ASCEND_VNPU_SPECS) to `spec`; returns the container paths added ([] when the
    runtime has nothing to do)."""
    env = list(spec.get("process", {}).get("env", []))
    ids = visible_ids(env) or []
    created = create_for_specs(env, device_dir, specs_first)
    if created is not None:
        ids.append(created)
    if not ids:
        return []
    wanted: list[tuple[Path, str]] = []
    for vnpu_id in ids:
        wanted.append((device_dir / f"vdavinci{vnpu_id}", f"/dev/davinci{vnpu_id}"))
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for host, path in wanted:
        device = _device(host, path)
        if device is None:
            raise StandInError(
                f"{ENV_VISIBLE_DEVICES} names vNPU {host.name.removeprefix('vdavinci')}, "
                f"but its device {host} does not exist on this host"
            )
        found.append(device)
    for name in CONTROL_DEVICES:
        device = _device(device_dir / name, f"/dev/{name}")
        if device is not None:
            found.append(device)

    linux = spec.setdefault("linux", {})
    devices = linux.setdefault("devices", [])
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    added = []
    # Appended even where the spec has the path already, as the real runtime's
    # addDeviceToSpec does: on a DRA node CDI put them there first, and a
    # stand-in that skipped them would hide what runc does with a node named twice.
    for entry, rule in found:
        devices.append(entry)
        rules.append(rule)
        added.append(str(entry["path"]))
    return added


def _log_error(log_path: str | None, message: str) -> None:
    print(message, file=sys.stderr)
    if not log_path:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps({"level": "error", "msg": message, "time": stamp})
    try:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(line + "\n")
    except OSError:
        pass


def main(argv: list[str]) -> int:
    runc = os.environ.get("VNPU_STANDIN_RUNC", "runc")
    device_dir = Path(os.environ.get("VNPU_STANDIN_DEVICE_DIR", "/dev"))
    specs_first = os.environ.get("VNPU_STANDIN_SPECS_FIRST", "") == "1"
    index, options = split_command(argv)
    if index >= 0 and argv[index] == "create":
        config = bundle_of(argv[index + 1 :]) / "config.json"
        try:
            spec = json.loads(config.read_text())
            if add_devices(spec, device_dir, specs_first):
                tmp = config.with_name(config.name + ".ascend")
                tmp.write_text(json.dumps(spec))
                os.replace(tmp, config)
        except (StandInError, OSError, ValueError) as exc:
            _log_error(options.get("--log"), f"ascend runtime: {exc}")
            return 1
    os.execvp(runc, [runc, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
