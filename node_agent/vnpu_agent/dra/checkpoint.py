"""The kubelet plugin's checkpoint: which claims are prepared on this node, in
two phases, across agent restarts and reboots (docs/DRA.md, "The kubelet
plugin").

- A claim is written `PrepareStarted` before Prepare reads anything, and
  `PrepareCompleted` with its devices once its CDI specs exist. Both count
  as prepared for a destroy: a vNPU whose Prepare is under way is never
  destroyed (NVIDIA's plugin keeps the same two phases).
- Each entry carries the boot id it was written in. After a reboot no
  container holds anything until the kubelet prepares again, so an entry of
  an earlier boot does not hold its vNPU and is answered only after Prepare
  checks everything again (the CDI directory is often a tmpfs, and the vNPUs
  may be gone).
- The file is written atomically, with a checksum. A file that cannot be read
  (or whose checksum does not match) is never guessed at: it is kept beside
  as `<name>.broken`, and while that file exists every claim the agent has
  not seen prepared or unprepared since counts as prepared (`held`): a
  running pod's deferred destroy is kept, never lost. The way out, once
  nothing on the node uses those vNPUs, is to remove the `.broken` file
  (docs/TROUBLESHOOTING.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

log = logging.getLogger(__name__)

VERSION: Final = 2
# Version 1 (before two phases): every entry was a completed Prepare of an
# unknown boot; it is read as completed in this boot (kept, never dropped).
READABLE_VERSIONS: Final = (1, 2)
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")

Phase = Literal["PrepareStarted", "PrepareCompleted"]
STARTED: Final[Phase] = "PrepareStarted"
COMPLETED: Final[Phase] = "PrepareCompleted"


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot; "" where there is none (not Linux)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True, slots=True)
class ClaimId:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as the checkpoint keeps it."""

    request: str
    pool: str
    device: str
    vnpu_id: int
    template: str
    cdi_ids: tuple[str, ...]
    chip: int = -1  # -1: a version 1 entry, which did not record it


@dataclass(slots=True)
class Entry:
    claim: ClaimId
    phase: Phase
    boot_id: str
    devices: list[PreparedDevice] = field(default_factory=list)


def _device_to_json(d: PreparedDevice) -> dict[str, Any]:
    return {
        "request": d.request,
        "pool": d.pool,
        "device": d.device,
        "vnpuId": d.vnpu_id,
        "chip": d.chip,
        "template": d.template,
        "cdiIds": list(d.cdi_ids),
    }


def _device_from_json(d: dict[str, Any]) -> PreparedDevice:
    return PreparedDevice(
        request=str(d["request"]),
        pool=str(d["pool"]),
        device=str(d["device"]),
        vnpu_id=int(d["vnpuId"]),
        template=str(d["template"]),
        cdi_ids=tuple(str(i) for i in d["cdiIds"]),
        chip=int(d.get("chip", -1)),
    )


def _checksum(claims: Any, settled: list[str]) -> str:
    canonical = json.dumps({"claims": claims, "settled": settled}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


class CheckpointError(ValueError):
    """The file exists but cannot be trusted."""


class Checkpoint:
    """The prepared claims of one node, kept in one JSON file."""

    def __init__(self, path: Path, boot_id: str | None = None) -> None:
        self.path = path
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self.entries: dict[str, Entry] = {}
        # Claims prepared or unprepared since the file was found broken: the
        # hold of `held` no longer applies to them.
        self.settled: set[str] = set()
        self._load()

    @property
    def broken_path(self) -> Path:
        return self.path.with_suffix(".broken")

    @property
    def broken(self) -> bool:
        """Whether an unreadable checkpoint is being held for a person."""
        return self.broken_path.exists()

    # -- what the destroy decision asks ---------------------------------------

    def current(self, uid: str) -> Entry | None:
        """The claim's entry of this boot, in either phase."""
        entry = self.entries.get(uid)
        return entry if entry is not None and entry.boot_id == self.boot_id else None

    def held(self, uid: str) -> str | None:
        """Why the claim's vNPUs must stay, or None."""
        entry = self.current(uid)
        if entry is not None:
            return "prepared" if entry.phase == COMPLETED else "being prepared"
        if uid not in self.settled and self.broken:
            return (
                f"the DRA checkpoint was unreadable (kept as {self.broken_path}); every claim "
                "not prepared or unprepared since counts as prepared"
            )
        return None

    def held_ids(self) -> dict[int, str]:
        """vNPU id -> the claim UID of a current entry that names it."""
        return {
            d.vnpu_id: uid
            for uid, e in self.entries.items()
            if e.boot_id == self.boot_id
            for d in e.devices
        }

    # -- reading and writing ---------------------------------------------------

    def _load(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            self._set_aside(exc)
            return
        try:
            self._parse(text)
        except (CheckpointError, ValueError, KeyError, TypeError) as exc:
            self.entries.clear()
            self.settled.clear()
            self._set_aside(exc)

    def _set_aside(self, exc: BaseException) -> None:
        # Never guess: the file is kept for a person, and until it is gone
        # every claim counts as prepared (held).
        log.error(
            "DRA checkpoint %s unreadable (%s); moved to %s. Every claim on this node counts "
            "as prepared until the kubelet prepares or unprepares it, or that file is removed",
            self.path, exc, self.broken_path,
        )  # fmt: skip
        with contextlib.suppress(OSError):
            os.replace(self.path, self.broken_path)

    def _parse(self, text: str) -> None:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise CheckpointError("not a JSON object")
        version = data.get("version")
        if version not in READABLE_VERSIONS:
            raise RuntimeError(
                f"DRA checkpoint {self.path} has version {version!r}, this agent reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}: an agent newer than this one wrote "
                "it; run that version, or drain the node before going back"
            )
        claims = data.get("claims") or {}
        settled = list(data.get("settled") or [])
        if version >= 2 and data.get("checksum") != _checksum(claims, settled):
            raise CheckpointError("checksum mismatch")
        for uid, raw in claims.items():
            self.entries[uid] = Entry(
                claim=ClaimId(str(raw["namespace"]), uid, str(raw["name"])),
                phase=raw.get("phase", COMPLETED) if version >= 2 else COMPLETED,
                boot_id=str(raw.get("bootId", "")) if version >= 2 else self.boot_id,
                devices=[_device_from_json(d) for d in raw.get("devices") or []],
            )
        self.settled = set(settled)

    def save(self) -> None:
        """Written to a new file, synced, then renamed over the old one: a
        crash leaves the old file or the new, never half of one."""
        claims = {
            uid: {
                "namespace": e.claim.namespace,
                "name": e.claim.name,
                "phase": e.phase,
                "bootId": e.boot_id,
                "devices": [_device_to_json(d) for d in e.devices],
            }
            for uid, e in sorted(self.entries.items())
        }
        # Settled claims matter only while a broken file is held.
        settled = sorted(self.settled) if self.broken else []
        body = {
            "version": VERSION,
            "claims": claims,
            "settled": settled,
            "checksum": _checksum(claims, settled),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(body, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
