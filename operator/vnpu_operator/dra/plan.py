"""What the operator does for one ResourceClaim: a pure function of the claim
and the VNPUAllocations that name it (docs/DRA.md, "From claim to container").

- Every device of our driver the scheduler allocated to the claim gets one
  allocation, named after the claim's UID and the device.
- An allocation no allocated device of the claim names any more (the claim
  was deallocated, is gone, or was re-created under its name with a new UID)
  is released. A claim being deleted keeps its allocations while it still
  lists their devices: it stays allocated and reserved for its pod until the
  kubelet is done with it, and the kubelet may still prepare it. It gets no
  new one: its devices without an allocation fail their binding instead.
- Each allocated device's binding conditions follow its allocation: Ready
  sets `vnpu.io/vnpu-ready`, Failed sets `vnpu.io/vnpu-failed` (the scheduler
  then deallocates the claim and tries again). The claim's status is written
  only when that changes what it says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vnpu_common.wire import names
from vnpu_operator.placement.capacity import (
    HEALTHY,
    ChipState,
    NodeState,
    chip_obstacle,
    free_vnpu_id,
)
from vnpu_operator.placement.reasons import Reason


@dataclass(frozen=True)
class ClaimDevice:
    """One device of our driver allocated to a claim."""

    request: str
    pool: str  # the node: each node is a pool of its own
    device: str
    # Allocated with adminAccess: the scheduler counts no counters for it.
    admin_access: bool = False


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
    # The scheduler's claim for an extended-resource request (KEP-5004).
    extended_resource: bool = False
    # Request name -> the DeviceClass it names (spec.devices.requests[].exactly).
    request_classes: Mapping[str, str] = field(default_factory=dict)

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


@dataclass(frozen=True)
class Refusal:
    """Why a device of a claim gets no allocation. `reason`: a short CamelCase
    word (the label of vnpu_operator_dra_claims_refused_total); `message`: what
    the claim's binding-failure condition says, with what to look at."""

    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


# Refusal reasons (metric label values; never rename one).
AGENT_DOWN = "AgentDown"
NOT_DRA_NODE = "NotDRANode"
UNKNOWN_DEVICE = "UnknownDevice"
CORDONED = "Cordoned"
UNHEALTHY = "Unhealthy"
NO_CAPACITY = "NoCapacity"
NO_FREE_ID = "NoFreeId"
CLAIM_DELETING = "ClaimDeleting"
ADMIN_ACCESS = "AdminAccess"
EXTENDED_RESOURCE = "ExtendedResource"
# A refusal given as a bare message.
REFUSED = "Refused"


@dataclass
class Plan:
    create: list[ClaimDevice] = field(default_factory=list)
    release: list[str] = field(default_factory=list)
    # Our entries of status.devices as they must be, when they must change.
    statuses: list[dict[str, Any]] | None = None
    # Devices whose allocation is still going away under the same name: the
    # claim waits for it.
    blocked: list[str] = field(default_factory=list)
    # Refused devices whose failure `statuses` writes for the first time
    # (counted once the write went through).
    refused: dict[str, Refusal] = field(default_factory=dict)


def claim_view(claim: Mapping[str, Any]) -> ClaimView:
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    devices = tuple(
        ClaimDevice(
            str(r.get("request", "")),
            str(r.get("pool", "")),
            str(r.get("device", "")),
            admin_access=bool(r.get("adminAccess")),
        )
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
    request_classes = {
        str(r.get("name", "")): str((r.get("exactly") or {}).get("deviceClassName", ""))
        for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
        if isinstance(r, Mapping) and isinstance(r.get("exactly") or {}, Mapping)
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
        extended_resource=names.DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION
        in (meta.get("annotations") or {}),
        request_classes=request_classes,
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
    refusals: Mapping[str, str | Refusal] | None = None,
) -> Plan:
    """`view` None: the claim is gone. `refusals`: device -> why no allocation
    can be made for it, or why the one it has will never be ready (a node
    whose agent is not live, no room on the chip, no free vNPU id, a cordoned
    or unhealthy chip): it fails the device's binding, which gives the claim
    back to the scheduler at once."""
    refused = {
        d: r if isinstance(r, Refusal) else Refusal(REFUSED, r) for d, r in (refusals or {}).items()
    }
    out = Plan()
    by_device: dict[str, AllocInfo] = {}
    wanted_devices = {d.device for d in view.devices} if view is not None else set()
    for alloc in allocs:
        current = view is not None and alloc.claim_uid == view.uid
        if current and alloc.device in wanted_devices:
            by_device[alloc.device] = alloc
        elif not alloc.deleting:
            out.release.append(alloc.key)
    if view is None:
        return out
    for device in view.devices:
        mine = by_device.get(device.device)
        if device.device in refused:
            continue
        if mine is None:
            if view.deleting:
                # A vNPU made now would only ever be destroyed again, and a
                # create racing the claim's release is how a destroy ends up
                # under a Prepare: the pod, if one waits, goes elsewhere.
                refused[device.device] = Refusal(
                    CLAIM_DELETING,
                    f"ResourceClaim {view.key} is being deleted: no new vNPU is made for it; "
                    "create a new claim for the pod",
                )
            else:
                out.create.append(device)
        elif mine.deleting:
            out.blocked.append(device.device)
    statuses: list[dict[str, Any]] = []
    changed = False
    for device in view.devices:
        refusal = refused.get(device.device)
        wanted = _wanted(
            device.device,
            by_device.get(device.device),
            None if refusal is None else str(refusal),
        )
        have = view.conditions.get(device.device, {})
        if {t: have.get(t) for t in wanted} != wanted:
            changed = True
            if refusal is not None:
                out.refused[device.device] = refusal
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


def route_refusal(view: ClaimView, device: ClaimDevice) -> Refusal | None:
    """Routes to a vNPU that no quota counts (docs/DRA.md, "What a tenant
    cannot ask for"): the chart's admission policies refuse both when the
    claim or pod is created; this is the operator's line where they are off
    or a DeviceClass they do not name selects vNPUs."""
    if device.admin_access:
        return Refusal(
            ADMIN_ACCESS,
            f"device {device.device}: admin access to vNPUs is not supported (it would get a "
            "vNPU that no quota or counter holds); list vNPUs with kubectl get "
            "vnpuallocations -A -o wide",
        )
    device_class = view.request_classes.get(device.request, "")
    if view.extended_resource and not _template_class(device_class, device.device):
        # Only vnpu.io/<template>, through its own class, is what quota on
        # requests.vnpu.io/<template> counts; the catch-all class vnpu.io as an
        # extended resource (deviceclass.resource.kubernetes.io/vnpu.io) is not.
        return Refusal(
            EXTENDED_RESOURCE,
            f"ResourceClaim {view.key} is the scheduler's claim for an extended resource "
            f"of DeviceClass {device_class or '?'}: vNPUs are served as an extended resource "
            "only as vnpu.io/<template> (e.g. vnpu.io/vir05_1c_16g: 1 in limits), through the "
            "chart's DeviceClass <template>.vnpu.io",
        )
    return None


def _template_class(device_class: str, device: str) -> bool:
    """`device_class` is the per-template class of `device`'s template."""
    parsed = names.parse_dra_device_name(device)
    return parsed is not None and device_class == names.template_device_class(parsed[1])


def pick_vnpu_id(state: NodeState | None, device: str, node: str = "") -> int | Refusal:
    """The vNPU id of a new allocation for `device` on `node`, whose capacity
    in the ledger `state` is (every allocation booked, releasing ones
    included, and every vNPU the node lists that no allocation declares:
    foreign vNPUs, orphans, destroys the agent deferred): the lowest free id
    of the device's chip, or why the device gets none. The chip is held to
    the rules placement holds annotated pods to (capacity.chip_obstacle):
    what the scheduler chose from the published pool is checked again here,
    where cordons and health hold whatever the claim tolerates."""
    node = node or (state.inventory.name if state is not None else "")
    parsed = names.parse_dra_device_name(device)
    if parsed is None:
        return Refusal(UNKNOWN_DEVICE, f"device {device} is not one the agent publishes")
    lease = names.lease_name(node)
    if state is None:
        return Refusal(
            AGENT_DOWN,
            f"node {node} publishes no VNPUNode (its agent is not running): "
            f"check the vnpu-agent pod on {node} and its Lease {lease}",
        )
    inventory = state.inventory
    if not inventory.status.dra:
        return Refusal(
            NOT_DRA_NODE,
            f"node {node} does not serve DRA (its vnpu-agent runs without --dra, chart value "
            "agent.dra): its ResourceSlices are stale; delete them or run the agent with --dra",
        )
    if not inventory.live:
        return Refusal(
            AGENT_DOWN,
            f"the vnpu-agent of node {node} is not live (its Lease {lease} expired, or the Node "
            f"is gone): no vNPU can be made there; check the vnpu-agent pod on {node}",
        )
    chip_index, template, _ = parsed
    chip = state.chips.get(chip_index)
    if chip is None:
        return Refusal(
            UNKNOWN_DEVICE,
            f"node {node} has no chip {chip_index} (kubectl get vnpunode {node} -o yaml)",
        )
    where = f"chip {chip_index} of node {node}"
    if chip.cordoned is not None:
        return Refusal(
            CORDONED,
            f"{where} is cordoned by an admin ({chip.cordoned}): no new vNPU goes there, "
            f"whatever the claim tolerates; uncordon it in spec.cordonedChips of VNPUNode {node}",
        )
    if chip.chip.health != HEALTHY:
        return Refusal(
            UNHEALTHY,
            f"{where} is {chip.chip.health}: no new vNPU goes there, whatever the claim "
            f"tolerates; see the chip's health in kubectl get vnpunode {node} -o yaml",
        )
    obstacle = chip_obstacle(chip, template, None, state.used_ids)
    if obstacle is None:
        found = free_vnpu_id(chip.chip, state.used_ids)
        if found is not None:
            return found
        obstacle = Reason.NO_FREE_VNPU_ID
    if obstacle is Reason.TEMPLATE_NOT_OFFERED:
        return Refusal(
            UNKNOWN_DEVICE,
            f"{where} does not offer template {template} (kubectl get vnpunode {node} -o yaml)",
        )
    if obstacle is Reason.NO_FREE_VNPU_ID:
        return Refusal(NO_FREE_ID, f"no free vNPU id on {where}{_held(chip, node)}")
    return Refusal(
        NO_CAPACITY,
        f"{where} has no room for a {template} in the operator's ledger "
        f"({obstacle.label}){_held(chip, node)}",
    )


def _held(chip: ChipState, node: str) -> str:
    """What holds a chip, and where to look: the vNPUs no allocation declares
    are what the published pool cannot show the scheduler."""
    held = f": {chip.allocated} vNPU(s) booked by allocations"
    if chip.orphans:
        held += (
            f" and {chip.orphans} that no allocation declares (foreign vNPUs, orphans in "
            "their grace period, destroys the agent deferred)"
        )
    return (
        f"{held}; the scheduler chooses another device. kubectl get vnpunode {node} -o yaml "
        f"lists the chip's vNPUs, kubectl get vnpuallocations -A -o wide the bookings"
    )
