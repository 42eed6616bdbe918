"""The node agent's view of its driver: chips, templates, the vNPUs present,
which of them the agent made, and what the driver's state says of the node.

Every driver call goes through `DriverView.call`: one at a time per node, in
a thread, with a timeout, timed and counted. The view is re-read by
`refresh` (each resync) and kept current in between by whoever calls the
driver (`added`, `removed`, `disowned`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from vnpu_agent.config import AgentSettings
from vnpu_agent.drivers.base import VNPU, ChipInfo, Driver, DriverError, DriverFailure, TemplateSpec
from vnpu_agent.gc import OrphanTracker
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.owned import OwnedIds
from vnpu_common.wire import names
from vnpu_common.wire.models import Condition, set_condition

# The node agent's log, as before it was split in modules (its lines unchanged).
log = logging.getLogger(__name__)
T = TypeVar("T")


class DriverView:
    def __init__(
        self, node: str, driver: Driver, settings: AgentSettings, metrics: AgentMetrics
    ) -> None:
        self.node = node
        self.driver = driver
        self.settings = settings
        self.metrics = metrics
        self.vnpus: dict[int, VNPU] = {}
        self.chips: list[ChipInfo] = []
        self.templates: dict[int, list[TemplateSpec]] = {}
        # Ids of the vNPUs this agent made (kept across restarts), and how
        # long each unreferenced one has been an orphan (gc.py).
        self.owned = OwnedIds(settings.state_dir / node / "owned.json")
        self.gc = OrphanTracker(settings.gc_grace_seconds, settings.foreign_vnpu_policy)
        # Ids of vNPUs whose allocation went while they still existed: until
        # they are destroyed, no new allocation gets them (serving.py,
        # _held_elsewhere).
        self.abandoned: set[int] = set()
        # Whether the last read of the driver answered.
        self.ok = False
        # The VNPUNode's conditions: Ready (the driver answers) and
        # ChipsHealthy (note_chip_health).
        self.conditions: list[Condition] = []
        self._lock = asyncio.Lock()
        # Chip health as the last resync acted on it (health_changes).
        self._health_seen: dict[int, bool] = {}

    async def call(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """One driver call at a time per node, in a thread, timed and counted."""
        async with self._lock:
            start = time.perf_counter()
            try:
                result = await asyncio.wait_for(
                    asyncio.to_thread(fn, *args), timeout=self.settings.driver_timeout_seconds
                )
            except TimeoutError as exc:
                self.metrics.driver_op(self.node, op, "timeout", time.perf_counter() - start)
                raise DriverFailure(
                    f"driver {op} timed out after {self.settings.driver_timeout_seconds:g}s"
                ) from exc
            except DriverError as exc:
                self.metrics.driver_op(self.node, op, exc.reason, time.perf_counter() - start)
                raise
            self.metrics.driver_op(self.node, op, "ok", time.perf_counter() - start)
            return result

    async def refresh(self) -> None:
        """Re-reads chips, templates and vNPUs; on failure keeps the old view
        (of the chips whose vNPUs it had not re-read yet)."""
        try:
            chips = await self.call("list_chips", self.driver.list_chips)
            templates: dict[int, list[TemplateSpec]] = {}
            for chip in chips:
                known = self.templates.get(chip.index)
                if known is None:
                    known = await self.call(
                        "list_templates", self.driver.list_templates, chip.index
                    )
                templates[chip.index] = known
                found = await self.call("list_vnpus", self.driver.list_vnpus, chip.index)
                # Each chip's listing replaces that chip's vNPUs at once: a
                # create or destroy by another task between two of these calls
                # (the driver lock is free in between) is newer than this
                # listing. Applied at the end, the listing brought destroyed
                # vNPUs back into the inventory until the next resync.
                self._replace_vnpus(chip.index, found)
        except DriverError as exc:
            if self.ok:
                log.error("driver query on %s failed: %s", self.node, exc)
            self.ok = False
            self._set_ready("False", exc.reason, str(exc))
            return
        present = {chip.index for chip in chips}
        self.vnpus = {i: v for i, v in self.vnpus.items() if v.chip in present}
        self.chips, self.templates = chips, templates
        self.ok = True
        self._set_ready("True", names.REASON_DRIVER_READY, f"{len(chips)} chips")

    def _replace_vnpus(self, chip: int, found: list[VNPU]) -> None:
        kept = {i: v for i, v in self.vnpus.items() if v.chip != chip}
        self.vnpus = kept | {v.id: v for v in found}
        if self.abandoned:  # nearly always empty: no set of every id per chip listed
            self.abandoned.intersection_update(self.vnpus)

    async def reread_chip(self, chip: int) -> None:
        """Re-reads the vNPUs of `chip` into the view (none dropped); a
        driver failure leaves the view as it was."""
        with contextlib.suppress(DriverError):
            for v in await self.call("list_vnpus", self.driver.list_vnpus, chip):
                self.vnpus[v.id] = v

    async def reread_chips(self) -> None:
        """Re-reads the chips (their free capacity and health); a driver
        failure leaves them as they were."""
        with contextlib.suppress(DriverError):
            self.chips = await self.call("list_chips", self.driver.list_chips)

    # -- the view kept current between refreshes ------------------------------

    def added(self, vnpu: VNPU) -> None:
        """`vnpu` was just created for an allocation."""
        self.vnpus[vnpu.id] = vnpu
        self.gc.forget(vnpu.id)

    def removed(self, vnpu_id: int) -> None:
        """The vNPU `vnpu_id` was just destroyed (or was not there)."""
        self.vnpus.pop(vnpu_id, None)
        self.abandoned.discard(vnpu_id)

    def disowned(self, vnpu_id: int) -> None:
        """The vNPU `vnpu_id` is no longer the agent's to collect."""
        self.owned.discard(vnpu_id)
        self.gc.forget(vnpu_id)

    # -- chip health ----------------------------------------------------------

    def chip_healthy(self, index: int) -> bool:
        return any(c.index == index and c.healthy for c in self.chips)

    def health_changes(self) -> set[int]:
        """The chips whose health changed since the last call (the last
        resync), not since the last read of the chips, which publishing
        refreshes in between."""
        changed = {c.index for c in self.chips if self._health_seen.get(c.index, True) != c.healthy}
        self._health_seen = {c.index: c.healthy for c in self.chips}
        return changed

    def note_chip_health(self) -> None:
        """The ChipsHealthy condition as the chips last read say."""
        sick = [c.index for c in sorted(self.chips, key=lambda c: c.index) if not c.healthy]
        self.conditions = set_condition(
            self.conditions,
            names.COND_CHIPS_HEALTHY,
            "False" if sick else "True",
            names.REASON_CHIP_UNHEALTHY if sick else names.REASON_CHIP_HEALTHY,
            f"unhealthy chips: {', '.join(map(str, sick))}; no new vNPU is placed there"
            if sick
            else "every chip reports healthy",
        )

    def _set_ready(self, status: Any, reason: str, message: str) -> None:
        self.conditions = set_condition(self.conditions, names.COND_READY, status, reason, message)
