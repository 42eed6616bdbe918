"""`kubectl vnpu why POD`: what the pod asks for, what the operator told it
(the vnpu.io/Allocated condition) and either where its vNPUs are or, for a
pod still waiting, why each node cannot host it.

The per-node reasons come from the operator's own ledger rebuilt from the
listed objects and asked to place the pod (`Ledger.place` on a private
copy; nothing is written), so they are the placer's reasons, worded as the
condition words them.

A pod asking `resources.limits: {vnpu.io/<template>: N}` went one of two ways
at admission (vnpu_operator.admission.limits): the annotation path, where the
webhook wrote the annotations and the pod reads as any annotated pod, or DRA,
where the pod carries no annotation and the scheduler's own ResourceClaim
(named in pod.status.extendedResourceClaimStatus) holds its devices. For the
latter the report is the claim: its devices, their VNPUAllocations and the
binding condition the operator wrote on each, read with the operator's own
claim reader (`dra.plan.claim_view`).
"""

from __future__ import annotations

from typing import Any

from vnpu_cli.errors import CliError
from vnpu_cli.snapshot import Snapshot, allocation_phase, catalog
from vnpu_cli.table import table
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.admission.limits import LimitsRequest, limits_request
from vnpu_operator.dra.plan import ClaimView, claim_view
from vnpu_operator.placement import (
    Allocation,
    InvalidRequestError,
    Ledger,
    NoFit,
    PodRequest,
    Resources,
)
from vnpu_operator.placement.capacity import (
    Catalog,
    build_node_state,
    chip_obstacle,
    template_resources,
)

PLACED = "placed"
WAITING = "waiting"
FINISHED = "finished"


# Which front-end serves the pod (admission.limits.Path, as the report names it).
ANNOTATION_PATH = "annotation"
DRA_PATH = "dra"

# A device's binding, as the operator's conditions on the claim say it.
BINDING_READY = "Ready"
BINDING_FAILED = "Failed"


def needs_claims(pod: Raw) -> bool:
    """Whether the report needs the ResourceClaims of the pod's namespace:
    only a pod on the DRA path has one, so no other pod pays for the list."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return names.ANN_TEMPLATE not in annotations and limits_request(pod) is not None


def build(pod: Raw, snapshot: Snapshot) -> dict[str, Any]:
    """Raises CliError for a pod that does not ask for vNPUs."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    annotations = meta.get("annotations") or {}
    asked = limits_request(pod)
    if names.ANN_TEMPLATE not in annotations:
        if asked is None:
            raise CliError(
                f"pod {key} does not ask for vNPUs (no {names.ANN_TEMPLATE} annotation, and no "
                f"{names.RESOURCE_PREFIX}<template> in its containers' resources.limits)"
            )
        return _build_dra(pod, snapshot, asked)
    report: dict[str, Any] = {
        **_head(pod),
        "request": {
            "template": annotations.get(names.ANN_TEMPLATE),
            "count": annotations.get(names.ANN_COUNT, "1"),
            "chipModel": annotations.get(names.ANN_CHIP_MODEL),
            "containers": annotations.get(names.ANN_CONTAINERS),
        },
        "path": ANNOTATION_PATH,
        # How an annotated pod was asked cannot be told afterwards: the webhook's charge
        # puts vnpu.io/<template> into every annotated pod's limits.
        "limits": [],
        "routing": None,
        "visibleDevices": annotations.get(names.ANN_VISIBLE_DEVICES),
        "condition": _condition(pod),
        "scheduling": None,
        "claim": None,
        "draNodes": None,
        "problem": None,
        "vnpus": [],
        "nodes": [],
        "fitsOn": None,
        "summary": None,
    }
    uid = meta.get("uid")
    mine = [(a, raw) for a, raw in snapshot.parsed_allocations() if a.pod_uid == uid]
    if mine:
        report["state"] = PLACED
        report["vnpus"] = [
            {
                "allocation": a.key,
                "node": a.node,
                "chip": a.chip,
                "vnpuId": a.vnpu_id,
                "template": a.template,
                "phase": allocation_phase(raw),
                "devicePath": names.device_path(a.vnpu_id),
            }
            for a, raw in mine
        ]
        return report
    if report["phase"] in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
        report["state"] = FINISHED
        return report
    report["state"] = WAITING
    try:
        request = PodRequest.from_pod(pod)
    except InvalidRequestError as exc:
        report["problem"] = str(exc)
        return report
    ledger = snapshot.ledger()
    inventories = [ledger.node(n) for n in ledger.node_names()]
    known = catalog(i for i in inventories if i is not None)
    outcome = ledger.place(request)
    if isinstance(outcome, NoFit):
        report["summary"] = outcome.message
        report["nodes"] = [
            {
                "node": node,
                "reason": str(reason),
                "message": reason.label,
                "chips": _chip_reasons(ledger, node, request, known),
            }
            for node, reason in sorted(outcome.node_reasons.items())
        ]
    else:
        # Capacity is there now: the operator places the pod at its next try
        # (it retries waiting pods whenever capacity grows).
        report["fitsOn"] = outcome.node
    return report


def _head(pod: Raw) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {
        "pod": f"{meta.get('namespace')}/{meta.get('name')}",
        "uid": meta.get("uid"),
        "phase": (pod.get("status") or {}).get("phase"),
        "node": (pod.get("spec") or {}).get("nodeName"),
    }


def _limits(asked: LimitsRequest | None) -> list[dict[str, Any]]:
    """Each container's vnpu.io/<template> in resources.limits, as the webhook read them."""
    if asked is None:
        return []
    return [
        {
            "container": a.name,
            "resource": names.template_resource(template),
            "template": template,
            "count": count,
        }
        for a in asked.askers
        for template, count in sorted(a.counts.items())
    ]


def _dra_nodes(snapshot: Snapshot, templates: list[str]) -> list[str]:
    """DRA nodes (VNPUNode status.dra) some chip of which offers one of
    `templates`: what the webhook asks before sending a pod to DRA."""
    wanted = set(templates)
    return sorted(
        i.name
        for i in snapshot.inventories()
        if i.status.dra
        and any(t.name in wanted for chip in i.status.chips for t in i.status.chip_templates(chip))
    )


def _build_dra(pod: Raw, snapshot: Snapshot, asked: LimitsRequest) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    templates = asked.templates
    counts = {t: asked.count(t) for t in templates}
    report: dict[str, Any] = {
        **_head(pod),
        "request": {
            "template": ",".join(templates),
            "count": str(counts[templates[0]]) if len(templates) == 1 else None,
            "counts": counts,
            "chipModel": None,
            "containers": ",".join(dict.fromkeys(a.name for a in asked.askers)),
        },
        "path": DRA_PATH,
        "limits": _limits(asked),
        "routing": "served by DRA (the scheduler's claim)",
        "visibleDevices": None,
        # The operator writes vnpu.io/Allocated on annotated pods only; a DRA
        # pod waits in the scheduler, whose condition says why.
        "condition": _condition(pod),
        "scheduling": _unschedulable(pod),
        "claim": None,
        "draNodes": _dra_nodes(snapshot, templates),
        "problem": "; ".join(asked.problems) or None,
        "vnpus": [],
        "nodes": [],
        "fitsOn": None,
        "summary": None,
    }
    report["claim"] = _claim(pod, snapshot)
    claim = report["claim"]
    if claim is not None:
        report["vnpus"] = claim["devices"]
    if report["phase"] in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
        report["state"] = FINISHED
    elif claim is None:
        report["state"] = WAITING
        report["summary"] = (
            "the scheduler's claim is not made yet: the scheduler has not allocated; check "
            f"`kubectl describe pod {meta.get('name')} -n {meta.get('namespace')}` events for "
            "the scheduler's reason, e.g. no DRA node with room"
        )
    elif any(d["binding"] == BINDING_FAILED for d in claim["devices"]):
        report["state"] = WAITING
        report["summary"] = (
            "the operator refused a device of the claim (its binding failed, above): the "
            "scheduler gives the claim back and allocates again"
        )
    elif claim["devices"] and all(d["phase"] == names.PHASE_READY for d in claim["devices"]):
        report["state"] = PLACED
    elif not claim["devices"]:
        report["state"] = WAITING
        report["summary"] = (
            claim["problem"]
            or f"the claim {claim['name']} is not allocated yet: the scheduler has not chosen "
            "devices for it"
        )
    else:
        report["state"] = WAITING
        report["summary"] = (
            "vNPUs on their way: the scheduler binds the pod once every device's "
            f"{names.DRA_COND_READY} is True (its VNPUAllocation Ready)"
        )
    return report


def _unschedulable(pod: Raw) -> dict[str, Any] | None:
    """The scheduler's PodScheduled=False condition: its reason for a pod
    whose claim it could not allocate."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return {
                "reason": condition.get("reason"),
                "message": condition.get("message"),
                "lastTransitionTime": condition.get("lastTransitionTime"),
            }
    return None


def _claim(pod: Raw, snapshot: Snapshot) -> dict[str, Any] | None:
    """The scheduler's claim for the pod, None when it made none yet. The
    pod's status names it; before the scheduler writes that, a claim of
    ours annotated as the scheduler's and owned by the pod is the one."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    uid = str(meta.get("uid") or "")
    recorded = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = recorded.get("resourceClaimName")
    raw = _find_claim(snapshot.claims, name, uid)
    if raw is None and name is None:
        return None
    view = None if raw is None else claim_view(raw)
    if view is not None:
        name = view.name
    containers = {
        str(m.get("requestName")): str(m.get("containerName"))
        for m in recorded.get("requestMappings") or []
    }
    problem = None
    if view is None:
        problem = snapshot.claims_problem or (
            f"ResourceClaim {namespace}/{name}, named in the pod's status, is not there "
            "(deleted, or the pod's status is stale)"
        )
    return {
        "name": name,
        "uid": None if view is None else view.uid,
        "source": "pod.status.extendedResourceClaimStatus" if recorded else "ownerReferences",
        "found": view is not None,
        "problem": problem,
        "requestMappings": list(recorded.get("requestMappings") or []),
        "devices": _claim_devices(snapshot, namespace, str(name), view, containers),
    }


def _find_claim(claims: list[Raw], name: str | None, pod_uid: str) -> Raw | None:
    for claim in claims:
        meta = claim.get("metadata") or {}
        if name is not None:
            if meta.get("name") == name:
                return claim
            continue
        owned = any(o.get("uid") == pod_uid for o in meta.get("ownerReferences") or [])
        if owned and names.DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION in (
            meta.get("annotations") or {}
        ):
            return claim
    return None


def _claim_devices(
    snapshot: Snapshot,
    namespace: str,
    name: str,
    view: ClaimView | None,
    containers: dict[str, str],
) -> list[dict[str, Any]]:
    """One row per allocated device of the claim, with its VNPUAllocation
    (the operator names them after the claim's UID and the device) and its
    binding. Without the claim (unreadable or gone) the allocations that
    name it are all there is to show."""
    allocations: dict[str, tuple[Allocation, Raw]] = {}
    for alloc, raw in snapshot.parsed_allocations():
        ref = (raw.get("spec") or {}).get("claim") or {}
        if alloc.namespace != namespace or ref.get("name") != name:
            continue
        if view is not None and ref.get("uid") != view.uid:
            continue  # a claim of the same name from before, being released
        allocations[str(ref.get("device"))] = (alloc, raw)
    if view is None:
        rows = [
            (str(((raw.get("spec") or {}).get("claim") or {}).get("request") or ""), a.node, d)
            for d, (a, raw) in sorted(allocations.items())
        ]
        conditions: dict[str, Any] = {}
    else:
        rows = [(d.request, d.pool, d.device) for d in view.devices]
        conditions = dict(view.conditions)
    out = []
    for request, pool, device in rows:
        pair = allocations.get(device)
        binding, reason, message = _binding(conditions.get(device) or {})
        booked = None if pair is None else pair[0]
        # A refused device has no allocation; its name still says the chip.
        parsed = names.parse_dra_device_name(device)
        out.append(
            {
                "container": containers.get(request),
                "request": request,
                "device": device,
                "node": pool if booked is None else booked.node,
                "allocation": None if booked is None else booked.key,
                "phase": None if pair is None else allocation_phase(pair[1]),
                "chip": booked.chip if booked is not None else (parsed[0] if parsed else None),
                "vnpuId": None if booked is None else booked.vnpu_id,
                "template": booked.template
                if booked is not None
                else (parsed[1] if parsed else None),
                "devicePath": None if booked is None else names.device_path(booked.vnpu_id),
                "binding": binding,
                "bindingReason": reason,
                "bindingMessage": message,
            }
        )
    return out


def _binding(
    conditions: dict[str, tuple[str, str, str]],
) -> tuple[str | None, str | None, str | None]:
    """(Ready or Failed or None, reason, message) of a device's binding
    conditions; None while the operator has written neither."""
    failed = conditions.get(names.DRA_COND_FAILED)
    if failed is not None and failed[0] == "True":
        return BINDING_FAILED, failed[1] or None, failed[2] or None
    ready = conditions.get(names.DRA_COND_READY)
    if ready is not None and ready[0] == "True":
        return BINDING_READY, ready[1] or None, ready[2] or None
    return None, None, None


def _condition(pod: Raw) -> dict[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.POD_COND_ALLOCATED:
            return {
                "status": condition.get("status"),
                "reason": condition.get("reason"),
                "message": condition.get("message"),
                "lastTransitionTime": condition.get("lastTransitionTime"),
            }
    return None


def _chip_reasons(
    ledger: Ledger, node: str, request: PodRequest, known: Catalog
) -> list[dict[str, Any]]:
    """For each chip of the node: why one more vNPU of the template does not
    fit there (None: it does), and what the chip has free, from the same
    capacity code the ledger places with."""
    inventory = ledger.node(node)
    if inventory is None:
        return []
    state = build_node_state(inventory, ledger.allocations_on(node), known)
    out = []
    for index in sorted(state.chips):
        chip_state = state.chips[index]
        obstacle = chip_obstacle(
            chip_state, request.template, request.chip_model, state.used_ids, request.charged
        )
        need = template_resources(chip_state.chip, request.template, known)
        out.append(
            {
                "chip": index,
                "model": chip_state.chip.model,
                "reason": None if obstacle is None else str(obstacle),
                "message": None if obstacle is None else obstacle.label,
                "free": _resources(chip_state.free),
                "needs": None if need is None else _resources(need),
            }
        )
    return out


def _resources(r: Resources) -> dict[str, int]:
    return {"aicore": r.aicore, "memoryMB": r.memory_mb, "aicpu": r.aicpu}


def _write_failing(condition: dict[str, Any] | None) -> bool:
    """Whether the operator's last word is that its writes for the pod fail."""
    return condition is not None and condition["reason"] in (
        names.REASON_WRITE_REFUSED,
        names.REASON_API_ERROR,
    )


def _chips_text(chips: list[dict[str, Any]]) -> str:
    parts = []
    for chip in chips:
        free = chip["free"]
        said = chip["message"] or "fits one"
        parts.append(
            f"{chip['chip']}: {said} (free {free['aicore']} AICore, {free['memoryMB']} MB)"
        )
    return "; ".join(parts)


def _asked_text(limits: list[dict[str, Any]]) -> str:
    return "resources.limits " + "; ".join(
        f"{e['container']} {e['resource']}: {e['count']}" for e in limits
    )


def text(report: dict[str, Any]) -> str:
    if report["path"] == DRA_PATH:
        return _dra_text(report)
    request = report["request"]
    lines = [
        f"Pod:        {report['pod']}",
        f"Phase:      {report['phase'] or '-'}",
        f"Node:       {report['node'] or '-'}",
        f"Request:    {request['count']} x {request['template']}"
        + (f" on chip model {request['chipModel']}" if request["chipModel"] else "")
        + (f" for containers {request['containers']}" if request["containers"] else ""),
    ]
    if report["limits"]:
        lines.append(f"Asked as:   {_asked_text(report['limits'])}")
        lines.append(f"Path:       {report['routing']}")
    condition = report["condition"]
    if condition is None:
        # The operator writes it only when it has something to tell: a pod
        # placed at its first try never gets one.
        lines.append(
            f"Condition:  {names.POD_COND_ALLOCATED} not set (set once a pod waited or failed)"
        )
    else:
        lines.append(
            f"Condition:  {names.POD_COND_ALLOCATED}={condition['status']} "
            f"{condition['reason']}: {condition['message'] or ''}".rstrip()
        )
    out = "\n".join(lines) + "\n"
    state = report["state"]
    if state == PLACED:
        out += f"\nvNPUs (visible devices {report['visibleDevices'] or '-'}):\n"
        out += table(
            ["NODE", "CHIP", "VNPU", "TEMPLATE", "PHASE", "DEVICE", "ALLOCATION"],
            [
                [v["node"], v["chip"], v["vnpuId"], v["template"], v["phase"],
                 v["devicePath"], v["allocation"]]
                for v in report["vnpus"]
            ],
        )  # fmt: skip
    elif state == FINISHED:
        out += "\nThe pod has ended; it holds no vNPUs.\n"
    elif report["problem"]:
        out += f"\nThe request cannot be placed as written:\n{report['problem']}\n"
    elif report["fitsOn"] and _write_failing(condition):
        assert condition is not None
        out += (
            f"\nNo vNPUs yet. Node {report['fitsOn']} has room, but the operator's writes for "
            f"this pod fail ({condition['reason']}): {condition['message']}\n"
            "Fix what the API server says (the operator's RBAC or an admission policy); the "
            "operator retries and places the pod once a write succeeds. Its log and the pod's "
            "Events say the same.\n"
        )
    elif report["fitsOn"]:
        out += (
            f"\nNo vNPUs yet. Node {report['fitsOn']} has room now; the operator places "
            "the pod at its next try.\n"
        )
    else:
        out += f"\nWaiting: {report['summary']}\n"
        out += table(
            ["NODE", "REASON", "CHIPS"],
            [[n["node"], n["message"], _chips_text(n["chips"])] for n in report["nodes"]],
        )
    return out


def _dra_text(report: dict[str, Any]) -> str:
    request = report["request"]
    asked = " + ".join(f"{n} x {t}" for t, n in request["counts"].items())
    lines = [
        f"Pod:        {report['pod']}",
        f"Phase:      {report['phase'] or '-'}",
        f"Node:       {report['node'] or '-'}",
        f"Request:    {asked} for containers {request['containers']}",
        f"Asked as:   {_asked_text(report['limits'])}",
        f"Path:       {report['routing']}",
    ]
    claim = report["claim"]
    if claim is None:
        lines.append("Claim:      not made yet")
    else:
        lines.append(f"Claim:      {claim['name']} (from {claim['source']})")
        if claim["problem"]:
            lines.append(f"            {claim['problem']}")
    scheduling = report["scheduling"]
    if scheduling is not None:
        lines.append(
            f"Scheduler:  PodScheduled=False {scheduling['reason']}: "
            f"{scheduling['message'] or ''}".rstrip()
        )
    out = "\n".join(lines) + "\n"
    if report["problem"]:
        out += f"\nThe request cannot be served as written:\n{report['problem']}\n"
    devices = report["vnpus"]
    if devices:
        out += "\nDevices of the claim:\n"
        out += table(
            ["CONTAINER", "DEVICE", "NODE", "CHIP", "VNPU", "PHASE", "BINDING", "ALLOCATION"],
            [
                [d["container"], d["device"], d["node"], d["chip"], d["vnpuId"], d["phase"],
                 d["binding"], d["allocation"]]
                for d in devices
            ],
        )  # fmt: skip
        for d in devices:
            if d["binding"] == BINDING_FAILED:
                out += f"{d['device']} refused: {d['bindingMessage'] or d['bindingReason']}\n"
    state = report["state"]
    if state == FINISHED:
        out += "\nThe pod has ended; its claim's vNPUs go with the claim.\n"
    elif state == WAITING:
        out += f"\nWaiting: {report['summary']}\n"
        if claim is None:
            templates = request["template"].replace(",", ", ")
            offering = ", ".join(report["draNodes"]) or "none"
            out += f"DRA nodes offering {templates}: {offering}\n"
    return out
