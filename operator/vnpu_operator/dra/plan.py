"""What the operator does for one ResourceClaim: a pure function of the claim
and the VNPUAllocations that name it (docs/DRA.md, "From claim to container").

- Every device of our driver the scheduler allocated to the claim gets one
  allocation, named after the claim's UID and the device.
- An allocation no allocated device of the claim names any more (the claim
  was deallocated, deleted, or re-created under its name) is released.
- Each allocated device's binding conditions follow its allocation: Ready
  sets `vnpu.io/vnpu-ready`, Failed sets `vnpu.io/vnpu-failed` (the scheduler
  then deallocates the claim and tries again). The claim's status is written
  only when that changes what it says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vnpu_common import names
from vnpu_operator.placement.capacity import NodeState, free_vnpu_id


@dataclass(frozen=True)
class ClaimDevice:
    """One device of our driver allocated to a claim."""

    request: str
    pool: str  # the node: each node is a pool of its own
    device: str


@dataclass(frozen=True)
class ClaimView:
    """What the plan reads of a ResourceClaim."""

    namespace: str
    name: str
    uid: str
    deleting: bool
    devices: tuple[ClaimDevice, ...]
    # The pod the claim is reserved for first (name, uid), if any.
    reserved_pod: tuple[str, str] | None
    # Device -> condition type -> (status, reason, message), of our entries
    # of status.devices.
    conditions: Mapping[str, Mapping[str, tuple[str, str, str]]]
    # Devices of our driver that have an entry in status.devices.
    listed: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class AllocInfo:
    """What the plan reads of one allocation of a claim."""

    key: str
    claim_uid: str
    device: str
    phase: str | None
    message: str
    deleting: bool


@dataclass
class Plan:
    create: list[ClaimDevice] = field(default_factory=list)
    release: list[str] = field(default_factory=list)
    # Our entries of status.devices as they must be, when they must change.
    statuses: list[dict[str, Any]] | None = None
    # Devices whose allocation is still going away under the same name: the
    # claim waits for it.
    blocked: list[str] = field(default_factory=list)


def claim_view(claim: Mapping[str, Any]) -> ClaimView:
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    devices = tuple(
        ClaimDevice(str(r.get("request", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in results
        if isinstance(r, Mapping) and r.get("driver") == names.DRA_DRIVER
    )
    reserved = next(
        (
            (str(r.get("name", "")), str(r.get("uid", "")))
            for r in status.get("reservedFor") or []
            if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("uid")
        ),
        None,
    )
    conditions: dict[str, dict[str, tuple[str, str, str]]] = {}
    listed: set[str] = set()
    for entry in status.get("devices") or []:
        if not isinstance(entry, Mapping) or entry.get("driver") != names.DRA_DRIVER:
            continue
        device = str(entry.get("device", ""))
        listed.add(device)
        conditions[device] = {
            str(c.get("type")): (
                str(c.get("status")),
                str(c.get("reason", "")),
                str(c.get("message", "")),
            )
            for c in entry.get("conditions") or []
            if isinstance(c, Mapping)
        }
    return ClaimView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        deleting=bool(meta.get("deletionTimestamp")),
        devices=devices,
        reserved_pod=reserved,
        conditions=conditions,
        listed=frozenset(listed),
    )


def alloc_info(obj: Mapping[str, Any]) -> AllocInfo | None:
    """None for an allocation that serves no claim."""
    meta = obj.get("metadata") or {}
    claim = (obj.get("spec") or {}).get("claim")
    if not isinstance(claim, Mapping):
        return None
    status = obj.get("status") or {}
    return AllocInfo(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        claim_uid=str(claim.get("uid", "")),
        device=str(claim.get("device", "")),
        phase=status.get("phase"),
        message=str(status.get("message") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )


# What each allocation phase makes of a device's binding conditions:
# condition type -> (status, reason).
_READY = {names.DRA_COND_READY: ("True", "VNPUReady")}
_FAILED = {
    names.DRA_COND_READY: ("False", names.REASON_ALLOCATION_FAILED),
    names.DRA_COND_FAILED: ("True", names.REASON_ALLOCATION_FAILED),
}


def _wanted(
    device: str, alloc: AllocInfo | None, refusal: str | None
) -> dict[str, tuple[str, str, str]]:
    """A device's conditions as they must be; {} while its vNPU is on its way."""
    if refusal is not None:
        return {t: (s, r, refusal) for t, (s, r) in _FAILED.items()}
    if alloc is None or alloc.deleting:
        return {}
    if alloc.phase == names.PHASE_READY:
        ready = f"vNPU of allocation {alloc.key} is ready"
        return {t: (s, r, ready) for t, (s, r) in _READY.items()}
    if alloc.phase == names.PHASE_FAILED:
        why = alloc.message or f"allocation {alloc.key} failed"
        return {t: (s, r, why) for t, (s, r) in _FAILED.items()}
    return {}


def plan(
    view: ClaimView | None,
    allocs: Iterable[AllocInfo],
    refusals: Mapping[str, str] | None = None,
) -> Plan:
    """`view` None: the claim is gone. `refusals`: device -> why no allocation
    can be made for it (an unknown node, no free vNPU id, a template the chip
    does not offer), which fails the device's binding."""
    refusals = refusals or {}
    out = Plan()
    by_device: dict[str, AllocInfo] = {}
    live = view is not None and not view.deleting
    wanted_devices = {d.device for d in view.devices} if view is not None and live else set()
    for alloc in allocs:
        current = view is not None and alloc.claim_uid == view.uid
        if current and alloc.device in wanted_devices:
            by_device[alloc.device] = alloc
        elif not alloc.deleting:
            out.release.append(alloc.key)
    if view is None:
        return out
    for device in view.devices if live else ():
        mine = by_device.get(device.device)
        if device.device in refusals:
            continue
        if mine is None:
            out.create.append(device)
        elif mine.deleting:
            out.blocked.append(device.device)
    statuses: list[dict[str, Any]] = []
    changed = False
    for device in view.devices if live else ():
        wanted = _wanted(device.device, by_device.get(device.device), refusals.get(device.device))
        have = view.conditions.get(device.device, {})
        if {t: have.get(t) for t in wanted} != wanted:
            changed = True
        if wanted or device.device in view.listed:
            statuses.append(_entry(device, wanted, have))
    if {e["device"] for e in statuses} != set(view.listed):
        changed = True
    if changed:
        out.statuses = statuses
    return out


def _entry(
    device: ClaimDevice,
    wanted: Mapping[str, tuple[str, str, str]],
    have: Mapping[str, tuple[str, str, str]],
) -> dict[str, Any]:
    """A status.devices entry; a condition keeps the shape of metav1.Condition
    (the writer adds lastTransitionTime)."""
    merged = dict(have)
    merged.update(wanted)
    return {
        "driver": names.DRA_DRIVER,
        "pool": device.pool,
        "device": device.device,
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": m[:1024]}
            for t, (s, r, m) in sorted(merged.items())
        ],
    }


def pick_vnpu_id(state: NodeState | None, device: str) -> int | str:
    """The vNPU id of a new allocation for `device` on the node whose
    capacity `state` is (with every allocation booked, releasing ones
    included): the lowest free id of the device's chip, or why there is none."""
    parsed = names.parse_dra_device_name(device)
    if parsed is None:
        return f"device {device} is not one the agent publishes"
    if state is None:
        return "the node publishes no VNPUNode (its agent is not running)"
    chip_index, template, _ = parsed
    chip = next((c for c in state.inventory.status.chips if c.index == chip_index), None)
    if chip is None:
        return f"the node has no chip {chip_index}"
    if template not in state.inventory.offers.get(chip_index, {}):
        return f"chip {chip_index} does not offer template {template}"
    found = free_vnpu_id(chip, state.used_ids)
    if found is None:
        return f"no free vNPU id on chip {chip_index}"
    return found
