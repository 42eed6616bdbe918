"""The simulator's persistent state: JSON in a file, shared between processes.

Every operation takes an exclusive `flock` on `<state>.lock`, reads the
file, changes it and replaces it atomically (write a temp file, `rename`), so
the agent, a test flipping flags and the CLI can all act at once without
tearing it. No fsync: the simulator needs atomicity, not power-loss safety.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnpu_agent.drivers.base import DriverFailure

STATE_VERSION = 1
OPS = ("create", "destroy", "query")


class SimStateError(DriverFailure):
    """The state file is missing, unreadable or made for other chips."""

    reason = "SimulatorStateError"


@dataclass
class SimChip:
    index: int
    model: str
    physical_id: int
    card_id: int
    device_id: int
    healthy: bool = True


@dataclass
class SimVnpu:
    id: int
    chip: int
    template: str
    in_use: bool = False


@dataclass
class Failure:
    """An injected failure of one operation kind."""

    code: int
    times: int | None = None  # None: every call fails until cleared
    after: bool = False  # fail after the change took effect ("mid-way")
    message: str = ""


@dataclass
class SimState:
    chips: list[SimChip]
    vnpus: dict[int, SimVnpu] = field(default_factory=dict)
    config_recover: bool = True
    failures: dict[str, Failure] = field(default_factory=dict)
    slow: dict[str, float] = field(default_factory=dict)
    stuck: set[int] = field(default_factory=set)
    vanished: set[int] = field(default_factory=set)
    boot_count: int = 0
    # Not persisted: set when a change must be kept although the operation
    # then raises (an injected failure that counts down or fires mid-way).
    keep_on_error: bool = field(default=False, compare=False)

    def layout(self) -> list[tuple[str, int]]:
        """Models in chip order, run-length encoded: [("910B3", 4), ...]."""
        out: list[tuple[str, int]] = []
        for chip in self.chips:
            if out and out[-1][0] == chip.model:
                out[-1] = (chip.model, out[-1][1] + 1)
            else:
                out.append((chip.model, 1))
        return out

    def to_json(self) -> dict[str, Any]:
        # Spelled out rather than dataclasses.asdict, whose recursive deep
        # copy was most of a driver call's CPU (every call reads, and every
        # change writes, the whole state).
        return {
            "version": STATE_VERSION,
            "chips": [
                {
                    "index": c.index,
                    "model": c.model,
                    "physical_id": c.physical_id,
                    "card_id": c.card_id,
                    "device_id": c.device_id,
                    "healthy": c.healthy,
                }
                for c in self.chips
            ],
            "vnpus": [
                {"id": v.id, "chip": v.chip, "template": v.template, "in_use": v.in_use}
                for v in sorted(self.vnpus.values(), key=lambda v: v.id)
            ],
            "config_recover": self.config_recover,
            "failures": {
                op: {"code": f.code, "times": f.times, "after": f.after, "message": f.message}
                for op, f in sorted(self.failures.items())
            },
            "slow": dict(sorted(self.slow.items())),
            "stuck": sorted(self.stuck),
            "vanished": sorted(self.vanished),
            "boot_count": self.boot_count,
        }

    @staticmethod
    def from_json(data: object) -> SimState:
        """Raises ValueError, KeyError or TypeError on a wrong shape."""
        if not isinstance(data, dict):
            raise TypeError("top level is not an object")
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported state version {data.get('version')!r}")
        chips = [SimChip(**_obj(c)) for c in _list(data["chips"])]
        vnpus = [SimVnpu(**_obj(v)) for v in _list(data["vnpus"])]
        state = SimState(
            chips=chips,
            vnpus={v.id: v for v in vnpus},
            config_recover=_bool(data["config_recover"]),
            failures={str(op): Failure(**_obj(f)) for op, f in _obj(data["failures"]).items()},
            slow={str(op): float(s) for op, s in _obj(data["slow"]).items()},
            stuck={int(i) for i in _list(data["stuck"])},
            vanished={int(i) for i in _list(data["vanished"])},
            boot_count=int(data["boot_count"]),
        )
        _check_types(state)
        return state


def _obj(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true/false, got {value!r}")
    return value


def _check_types(state: SimState) -> None:
    # Dataclasses do not check field types; a hand-edited file must not
    # surface later as a TypeError deep inside an operation.
    for chip in state.chips:
        for name in ("index", "physical_id", "card_id", "device_id"):
            if type(getattr(chip, name)) is not int:
                raise TypeError(f"chip {name} must be an integer")
        if not isinstance(chip.model, str) or type(chip.healthy) is not bool:
            raise TypeError("chip model must be a string and healthy a boolean")
    for vnpu in state.vnpus.values():
        if type(vnpu.id) is not int or type(vnpu.chip) is not int:
            raise TypeError("vnpu id and chip must be integers")
        if not isinstance(vnpu.template, str) or type(vnpu.in_use) is not bool:
            raise TypeError("vnpu template must be a string and in_use a boolean")
    for op, failure in state.failures.items():
        if op not in OPS or type(failure.code) is not int:
            raise ValueError(f"bad failure entry for {op!r}")
    if any(op not in OPS for op in state.slow):
        raise ValueError("slow faults name an unknown operation")


class StateStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")

    @contextmanager
    def locked(self) -> Iterator[None]:
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SimStateError(f"cannot open simulator lock file {self.lock_path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> SimState:
        """Call with the lock held."""
        return self._read()[0]

    def _read(self) -> tuple[SimState, str]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise SimStateError(f"simulator state {self.path} does not exist") from exc
        except OSError as exc:
            raise SimStateError(f"cannot read simulator state {self.path}: {exc}") from exc
        try:
            return SimState.from_json(json.loads(text)), text
        except (ValueError, KeyError, TypeError) as exc:
            raise SimStateError(f"simulator state {self.path} is corrupt: {exc!r}") from exc

    def write(self, state: SimState) -> None:
        """Call with the lock held."""
        try:
            write_atomic(self.path, _serialize(state))
        except OSError as exc:
            raise SimStateError(f"cannot write simulator state {self.path}: {exc}") from exc

    @contextmanager
    def transaction(self, op: str | None = None, *, query: bool = False) -> Iterator[SimState]:
        """Locked read-modify-write. If the body raises, nothing is written
        unless it set `keep_on_error`: an injected failure that fired must
        still be counted, and a mid-way failure must leave its effect.

        With `op`, a "slow" fault injected for that operation is served
        first: the lock is let go for the sleep (a slow call must not freeze
        other processes) and the state read again after it.

        `query`: a body that changes the state only by raising (a query,
        whose one change is an injected fault that fires): a body that
        returns writes nothing, and the state is not serialized again to
        find that out (a quarter of a query's CPU, and a resync makes one
        per chip and one more)."""
        while True:
            with self.locked():
                state, text = self._read()
                delay = state.slow.get(op, 0.0) if op is not None else 0.0
                if delay <= 0:
                    try:
                        yield state
                    except BaseException:
                        if state.keep_on_error:
                            self.write(state)
                        raise
                    # The text read is what our last write wrote, so an
                    # unchanged state serializes to the same text.
                    if not query and _serialize(state) != text:
                        self.write(state)
                    return
            time.sleep(delay)
            op = None


def _serialize(state: SimState) -> str:
    # Compact: json's C encoder does not indent, and `jq .` reads it for people.
    return json.dumps(state.to_json(), separators=(",", ":")) + "\n"


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
