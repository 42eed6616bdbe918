"""`kubectl vnpu why POD`: what the pod asks for, what the operator told it
(the vnpu.io/Allocated condition) and either where its vNPUs are or, for a
pod still waiting, why each node cannot host it.

The per-node reasons come from the operator's own ledger rebuilt from the
listed objects and asked to place the pod (`Ledger.place` on a private
copy; nothing is written), so they are the placer's reasons, worded as the
condition words them.
"""

from __future__ import annotations

from typing import Any

from vnpu_cli.errors import CliError
from vnpu_cli.snapshot import Snapshot, allocation_phase, catalog
from vnpu_cli.table import table
from vnpu_common import names
from vnpu_common.types import Raw
from vnpu_operator.placement import (
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


def build(pod: Raw, snapshot: Snapshot) -> dict[str, Any]:
    """Raises CliError for a pod that does not ask for vNPUs."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    annotations = meta.get("annotations") or {}
    if names.ANN_TEMPLATE not in annotations:
        raise CliError(f"pod {key} does not ask for vNPUs (no {names.ANN_TEMPLATE} annotation)")
    report: dict[str, Any] = {
        "pod": key,
        "uid": meta.get("uid"),
        "phase": (pod.get("status") or {}).get("phase"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "request": {
            "template": annotations.get(names.ANN_TEMPLATE),
            "count": annotations.get(names.ANN_COUNT, "1"),
            "chipModel": annotations.get(names.ANN_CHIP_MODEL),
            "containers": annotations.get(names.ANN_CONTAINERS),
        },
        "visibleDevices": annotations.get(names.ANN_VISIBLE_DEVICES),
        "condition": _condition(pod),
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


def text(report: dict[str, Any]) -> str:
    request = report["request"]
    lines = [
        f"Pod:        {report['pod']}",
        f"Phase:      {report['phase'] or '-'}",
        f"Node:       {report['node'] or '-'}",
        f"Request:    {request['count']} x {request['template']}"
        + (f" on chip model {request['chipModel']}" if request["chipModel"] else "")
        + (f" for containers {request['containers']}" if request["containers"] else ""),
    ]
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
