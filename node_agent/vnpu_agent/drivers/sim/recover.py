"""The simulator's config-recover file, in the format of `/etc/vnpu.cfg`.

Each live vNPU created while recover mode is on has one line:
`<phy>:<vdev>:npu-smi set -t create-vnpu -i <card> -c <chip> -f <tmpl> -v <vdev>`
(optionally followed by ` -g <vgroup>`). A destroy removes the vNPU's line
by rewriting the file, as the real driver does, rather than appending a
destroy record: the file always lists exactly what a reboot brings back.
Destroys remove the line even while recover mode is off, so turning it on
later cannot resurrect a vNPU that was destroyed in between.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vnpu_agent.drivers.sim.state import SimStateError, write_atomic

_LINE = re.compile(
    r"^(?P<phy>\d+):(?P<vdev>\d+):npu-smi set -t create-vnpu -i (?P<card>\d+) -c (?P<chip>\d+)"
    r" -f (?P<template>\S+) -v (?P<vdev2>\d+)(?: -g (?P<vgroup>\d+))?\s*$"
)


@dataclass(frozen=True)
class RecoverEntry:
    physical_id: int
    vnpu_id: int
    card_id: int
    device_id: int
    template: str


def format_line(entry: RecoverEntry) -> str:
    return (
        f"{entry.physical_id}:{entry.vnpu_id}:npu-smi set -t create-vnpu -i {entry.card_id} "
        f"-c {entry.device_id} -f {entry.template} -v {entry.vnpu_id}"
    )


def parse_line(line: str) -> RecoverEntry | None:
    """None for a line that is not a well-formed create record."""
    match = _LINE.match(line.strip())
    if match is None or match["vdev"] != match["vdev2"]:
        return None
    return RecoverEntry(
        physical_id=int(match["phy"]),
        vnpu_id=int(match["vdev"]),
        card_id=int(match["card"]),
        device_id=int(match["chip"]),
        template=match["template"],
    )


def read_lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise SimStateError(f"cannot read config-recover file {path}: {exc}") from exc


def append(path: Path, entry: RecoverEntry) -> None:
    _rewrite(path, [*read_lines(path), format_line(entry)])


def remove(path: Path, physical_id: int, vnpu_id: int) -> None:
    lines = read_lines(path)
    kept = [line for line in lines if not _is_for(line, physical_id, vnpu_id)]
    if len(kept) != len(lines):
        _rewrite(path, kept)


def _is_for(line: str, physical_id: int, vnpu_id: int) -> bool:
    entry = parse_line(line)
    return entry is not None and (entry.physical_id, entry.vnpu_id) == (physical_id, vnpu_id)


def _rewrite(path: Path, lines: list[str]) -> None:
    try:
        write_atomic(path, "".join(f"{line}\n" for line in lines))
    except OSError as exc:
        raise SimStateError(f"cannot write config-recover file {path}: {exc}") from exc
