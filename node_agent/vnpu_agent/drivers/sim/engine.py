"""`sim`: a simulator of the Ascend vNPU driver, faithful where it matters.

It reproduces what docs/ASCEND.md describes: template catalog per chip model,
capacity checks on AICore, memory, AICPU and media units with the kernel's
messages, id ranges per physical chip (unique per server, 0xFFFFFFFF =
driver picks), `is_container_used` (set by `open_vnpu`, cleared by
`release_vnpu`), refusal to destroy a vNPU in use, the config-recover file
replayed by `reboot()`, and injected faults. Error codes are those DCMI
gives: the kernel answers -EINVAL (DCMI -8001) for every refusal.

State lives in a JSON file (see state.py) so that an agent restart sees
the same devices and other processes (tests, the CLI) can act on them:
`python -m vnpu_agent.drivers.sim --state F show|open|release|reboot|inject|...`
(cli.py).
Chips are indexed in layout order with physical_id = card_id = index and
device_id = 0.

Faults persist in the state until cleared and survive `reboot()` (they are
the test's setup, not the device's), except the per-vNPU ones (stuck,
vanished), which go with the vNPUs. A "vanished" vNPU stays in the driver's
table and holds its resources, but querying it fails with -8005, so listing
its chip fails as a whole, as both real listing paths do; destroying it
works and is the way out.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vnpu_agent.drivers.base import (
    DCMI_INNER_ERR,
    DCMI_INVALID_PARAMETER,
    VNPU,
    ChipInfo,
    DriverFailure,
    InUseError,
    NotFoundError,
    TemplateSpec,
)
from vnpu_agent.drivers.diagnose import describe_create
from vnpu_agent.drivers.sim import recover
from vnpu_agent.drivers.sim.rules import (
    MAX_CHIPS,
    RebootReport,
    check_create,
    check_op,
    chip_info,
    find_chip,
    find_vnpu,
    fire_failure,
    format_layout,
    model_of,
    new_state,
    parse_layout,
    replay,
    to_public,
)
from vnpu_agent.drivers.sim.state import Failure, SimState, SimStateError, SimVnpu, StateStore
from vnpu_common.wire import names

__all__ = ["MAX_CHIPS", "NULL_DEVICE", "RebootReport", "SimDriver", "parse_layout"]

# Major and minor of /dev/null on Linux (devices.txt), the device every
# simulated vNPU node is.
NULL_DEVICE: tuple[int, int] = (1, 3)


class SimDriver:
    name = "sim"

    def __init__(
        self,
        state_path: str | os.PathLike[str],
        layout: Mapping[str, int] | str | None = None,
        *,
        recover_path: str | os.PathLike[str] | None = None,
        device_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Opens the state at `state_path`, creating it from `layout` if it
        does not exist. An existing state must have been made for the same
        layout. The config-recover file defaults to `vnpu.cfg` next to the
        state file: give each simulated node its own directory.

        With `device_dir`, every vNPU also has a character device node
        `<device_dir>/vdavinci<id>` (the real driver's host name, see
        names.device_path) while it exists, so that a container runtime on a
        real node can map it into a container. The node is /dev/null's
        device (1:3): a process in the container can open, read and write it
        harmlessly, and no driver needs to be loaded."""
        self.device_dir = Path(device_dir) if device_dir is not None else None
        self.state_path = Path(state_path)
        self.recover_path = (
            Path(recover_path) if recover_path else self.state_path.parent / "vnpu.cfg"
        )
        self._store = StateStore(self.state_path)
        wanted = None if layout is None else parse_layout(layout)
        with self._store.locked():
            if self._store.exists():
                have = self._store.read().layout()
                if wanted is not None and have != wanted:
                    raise SimStateError(
                        f"simulator state {self.state_path} was made for chips "
                        f"{format_layout(have)}, not {format_layout(wanted)}; "
                        "delete it or use the same layout"
                    )
            elif wanted is None:
                raise SimStateError(
                    f"simulator state {self.state_path} does not exist; "
                    "give a chip layout to create it"
                )
            else:
                self._store.write(new_state(wanted))

    # ------------------------------------------------------------------ queries

    def list_chips(self) -> list[ChipInfo]:
        state = self._query("list chips")
        return [chip_info(state, c) for c in state.chips]

    def list_templates(self, chip: int) -> list[TemplateSpec]:
        state = self._query(f"list templates of chip {chip}")
        return list(model_of(find_chip(state, chip)).templates)

    def list_vnpus(self, chip: int) -> list[VNPU]:
        what = f"list vNPUs of chip {chip}"
        state = self._query(what)
        find_chip(state, chip)
        mine = sorted((v for v in state.vnpus.values() if v.chip == chip), key=lambda v: v.id)
        for v in mine:
            if v.id in state.vanished:
                raise DriverFailure(
                    f"{what} failed: querying vNPU {v.id} failed",
                    code=DCMI_INNER_ERR,
                    driver_message=f"get vdev({v.id}) resource failed, ret:{DCMI_INNER_ERR}",
                )
        return [to_public(v) for v in mine]

    def query_vnpu(self, vnpu_id: int) -> VNPU:
        """One vNPU, as DCMI's per-vdev resource query sees it (not part of
        the Driver interface; the DCMI stand-in uses it)."""
        what = f"query vNPU {vnpu_id}"
        state = self._query(what)
        found = state.vnpus.get(vnpu_id)
        if found is None or vnpu_id in state.vanished:
            raise (DriverFailure if found else NotFoundError)(
                f"{what} failed: {'it vanished' if found else 'no such vNPU'}",
                code=DCMI_INNER_ERR,
                driver_message=f"get vdev({vnpu_id}) resource failed, ret:{DCMI_INNER_ERR}",
            )
        return to_public(found)

    def config_recover_enabled(self) -> bool:
        return self._query("query config-recover mode").config_recover

    # ------------------------------------------------------------------ changes

    def create_vnpu(self, chip: int, template: str, vnpu_id: int) -> VNPU:
        what = describe_create(chip, template, vnpu_id)
        with self._store.transaction("create") as state:
            fire_failure(state, "create", what, after=False)
            c = find_chip(state, chip)
            new_id = check_create(state, c, template, vnpu_id, what)
            state.vnpus[new_id] = SimVnpu(id=new_id, chip=chip, template=template)
            if state.config_recover:
                recover.append(
                    self.recover_path,
                    recover.RecoverEntry(c.physical_id, new_id, c.card_id, c.device_id, template),
                )
            # The device exists once the driver made the vNPU, even if the
            # call then fails (the "fails midway" fault leaves it behind).
            self._make_device_node(new_id)
            fire_failure(state, "create", what, after=True)
            return to_public(state.vnpus[new_id])

    def destroy_vnpu(self, chip: int, vnpu_id: int) -> None:
        what = f"destroy vNPU {vnpu_id} on chip {chip}"
        with self._store.transaction("destroy") as state:
            fire_failure(state, "destroy", what, after=False)
            c = find_chip(state, chip)
            found = state.vnpus.get(vnpu_id)
            if found is None or found.chip != chip:
                raise NotFoundError(
                    f"{what} failed: chip {chip} has no vNPU {vnpu_id}",
                    code=DCMI_INVALID_PARAMETER,
                    driver_message=f"vdev_id({vnpu_id}) is not exist",
                )
            if found.in_use:
                raise InUseError(
                    f"{what} failed: vNPU {vnpu_id} is in use by a container",
                    code=DCMI_INVALID_PARAMETER,
                    driver_message=f"vdev_id({vnpu_id}) is inused",
                )
            del state.vnpus[vnpu_id]
            state.vanished.discard(vnpu_id)
            state.stuck.discard(vnpu_id)
            recover.remove(self.recover_path, c.physical_id, vnpu_id)
            self._remove_device_node(vnpu_id)
            fire_failure(state, "destroy", what, after=True)

    def set_config_recover(self, enabled: bool) -> None:
        with self._store.transaction() as state:
            state.config_recover = enabled

    # ------------------------------------------------- what tests and humans do

    def open_vnpu(self, vnpu_id: int) -> VNPU:
        """A container opens the device: is_container_used becomes 1."""
        with self._store.transaction() as state:
            found = find_vnpu(state, vnpu_id, "open")
            if vnpu_id in state.vanished:
                raise NotFoundError(
                    f"open vNPU {vnpu_id} failed: it vanished",
                    code=DCMI_INNER_ERR,
                    driver_message=f"open /dev/vdavinci{vnpu_id} failed",
                )
            found.in_use = True
            return to_public(found)

    def release_vnpu(self, vnpu_id: int) -> VNPU:
        """The container's namespace releases the device; a stuck vNPU stays in use."""
        with self._store.transaction() as state:
            found = find_vnpu(state, vnpu_id, "release")
            if vnpu_id not in state.stuck:
                found.in_use = False
            return to_public(found)

    def reboot(self) -> RebootReport:
        """Power cycle: every vNPU and in-use flag is gone; with recover mode
        on, the config-recover file is replayed line by line."""
        report = RebootReport()
        with self._store.transaction() as state:
            for vnpu_id in state.vnpus:
                self._remove_device_node(vnpu_id)
            state.vnpus.clear()
            state.stuck.clear()
            state.vanished.clear()
            state.boot_count += 1
            if not state.config_recover:
                return report
            for line in recover.read_lines(self.recover_path):
                replay(state, line, report)
            for vnpu_id in state.vnpus:
                self._make_device_node(vnpu_id)
        return report

    def device_node(self, vnpu_id: int) -> Path | None:
        """Where the vNPU's device node is (exists or not); None without a device dir."""
        if self.device_dir is None:
            return None
        return self.device_dir / Path(names.device_path(vnpu_id)).name

    def _make_device_node(self, vnpu_id: int) -> None:
        path = self.device_node(vnpu_id)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*NULL_DEVICE))
        # mknod's mode is masked by the umask; the runtime copies the mode.
        os.chmod(path, 0o666)

    def _remove_device_node(self, vnpu_id: int) -> None:
        path = self.device_node(vnpu_id)
        if path is not None:
            path.unlink(missing_ok=True)

    def inject_failure(
        self,
        op: str,
        code: int = DCMI_INNER_ERR,
        *,
        times: int | None = None,
        after: bool = False,
        message: str = "",
    ) -> None:
        """Make `op` (create, destroy or query) fail with DCMI `code`, every
        time or the next `times` calls. `after`: the change happens, then the
        call reports failure (a create or destroy that fails mid-way)."""
        check_op(op)
        if times is not None and times < 1:
            raise SimStateError(f"times must be at least 1, not {times}")
        with self._store.transaction() as state:
            state.failures[op] = Failure(code=code, times=times, after=after, message=message)

    def inject_slow(self, op: str, seconds: float) -> None:
        """Make `op` take `seconds` longer; 0 removes the delay."""
        check_op(op)
        with self._store.transaction() as state:
            if seconds > 0:
                state.slow[op] = float(seconds)
            else:
                state.slow.pop(op, None)

    def set_chip_health(self, chip: int, healthy: bool) -> None:
        with self._store.transaction() as state:
            find_chip(state, chip).healthy = healthy

    def mark_stuck(self, vnpu_id: int) -> None:
        """A container holds the vNPU forever: in use, and release does nothing."""
        with self._store.transaction() as state:
            find_vnpu(state, vnpu_id, "mark stuck").in_use = True
            state.stuck.add(vnpu_id)

    def mark_vanished(self, vnpu_id: int) -> None:
        with self._store.transaction() as state:
            find_vnpu(state, vnpu_id, "mark vanished")
            state.vanished.add(vnpu_id)

    def clear_faults(self) -> None:
        """Removes every injected fault and makes all chips healthy; in-use
        flags stay as they are."""
        with self._store.transaction() as state:
            state.failures.clear()
            state.slow.clear()
            state.stuck.clear()
            state.vanished.clear()
            for chip in state.chips:
                chip.healthy = True

    def snapshot(self) -> dict[str, Any]:
        """Everything, JSON-ready, without firing any fault."""
        with self._store.locked():
            state = self._store.read()
            recover_lines = recover.read_lines(self.recover_path)
        return {
            "state": str(self.state_path),
            "recover_file": str(self.recover_path),
            "config_recover": state.config_recover,
            "boot_count": state.boot_count,
            "chips": [
                {
                    **asdict(chip_info(state, c)),
                    "templates": [t.name for t in model_of(c).templates],
                }
                for c in state.chips
            ],
            "vnpus": [
                asdict(to_public(v)) for v in sorted(state.vnpus.values(), key=lambda v: v.id)
            ],
            "faults": {
                "failures": {op: asdict(f) for op, f in sorted(state.failures.items())},
                "slow": dict(sorted(state.slow.items())),
                "unhealthy_chips": [c.index for c in state.chips if not c.healthy],
                "stuck": sorted(state.stuck),
                "vanished": sorted(state.vanished),
            },
            "recover_lines": recover_lines,
        }

    # ---------------------------------------------------------------- internals

    def _query(self, what: str) -> SimState:
        with self._store.transaction("query", query=True) as state:
            fire_failure(state, "query", what, after=False)
            return state
