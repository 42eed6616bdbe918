"""`kubectl vnpu defrag`: which running vNPU pods, rescheduled, would turn
scattered free capacity into whole free chips, and how many more of the
largest template would then fit. It only reads: it evicts, cordons and
moves nothing.

The plan is the operator's own placement code on a private copy of the
ledger (vnpu_operator.placement.defrag), each pod re-placed with its own
request as it asked (the operator's pin to its current node taken off), so
a pod that may not run elsewhere (selector, affinity, taints, chip model) is
never suggested.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vnpu_cli.errors import CliError
from vnpu_cli.snapshot import Snapshot
from vnpu_cli.table import table
from vnpu_common.wire.types import Raw
from vnpu_operator.lifecycle import is_deleting, is_terminal
from vnpu_operator.pinning import unpinned
from vnpu_operator.placement import InvalidRequestError, PodRequest, Policy
from vnpu_operator.placement.defrag import CORDON_REASON, MAX_TRIALS, Plan, plan

NOTHING_EVICTED = "Nothing was evicted or moved: kubectl vnpu defrag only reads."


def build(
    snapshot: Snapshot, *, policy: Policy, max_moves: int, node: str | None = None
) -> dict[str, Any]:
    """The JSON report (docs/USAGE.md, `kubectl vnpu defrag`). Raises CliError
    for a node no VNPUNode describes."""
    ledger = snapshot.ledger()
    if node is not None and ledger.node(node) is None:
        raise CliError(f'VNPUNode "{node}" not found: no vnpu agent serves a node of that name')
    labels = {
        str((n.get("metadata") or {}).get("name")): (n.get("metadata") or {}).get("labels") or {}
        for n in snapshot.nodes
    }
    placed_on = {a.pod_uid: a.node for a, _ in snapshot.parsed_allocations()}
    requests: dict[str, PodRequest] = {}
    owners: dict[str, str | None] = {}
    for pod in snapshot.pods:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        where = placed_on.get(uid)
        if where is None or is_deleting(pod) or is_terminal(pod):
            continue
        try:
            requests[uid] = PodRequest.from_pod(unpinned(pod, where, labels.get(where, {})))
        except InvalidRequestError:
            continue  # a request the placer cannot read again is not moved
        owners[uid] = _owner(pod)
    result = plan(ledger, requests, policy, max_moves=max_moves, node=node)
    return _report(result, owners, max_moves)


def _owner(pod: Raw) -> str | None:
    """Kind/name of the controller that recreates the pod, None for a bare pod."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ref.get('kind')}/{ref.get('name')}"
    return None


def _report(result: Plan, owners: Mapping[str, str | None], max_moves: int) -> dict[str, Any]:
    steps = [
        {
            "node": step.node,
            "chip": step.chip,
            "pods": [
                {
                    "pod": move.pod.key,
                    "uid": move.pod.uid,
                    "owner": owners.get(move.pod.uid),
                    "template": move.pod.template,
                    "count": move.pod.count,
                    "from": {"node": move.node, "chips": list(move.chips)},
                    "to": {"node": move.to_node, "chips": list(move.to_chips)},
                }
                for move in step.moves
            ],
            "wholeChips": [{"node": n, "chip": c} for n, c in step.whole],
            "largestFits": {"before": dict(step.before), "after": dict(step.after)},
        }
        for step in result.steps
    ]
    return {
        "policy": str(result.policy),
        "maxMoves": max_moves,
        "evicted": 0,
        "largestTemplates": dict(result.largest),
        "largestFits": {
            "before": dict(result.before),
            "after": dict(result.after),
            "limit": dict(result.limit),
        },
        "podsToMove": result.pods_moved,
        "chipsConsidered": result.candidates,
        "chipsTried": result.tried,
        "steps": steps,
        "summary": _summary(result),
    }


def _summary(result: Plan) -> str:
    said = _said(result)
    if result.tried >= MAX_TRIALS:
        said += (
            f" The search stopped after trying {result.tried} of {result.candidates} "
            "chips; run it again after applying, or with --node, to look further."
        )
    return said


def _said(result: Plan) -> str:
    if result.steps:
        gains = ", ".join(
            f"{model} {result.before.get(model, 0)} -> {result.after[model]} x "
            f"{result.largest[model]}"
            for model in sorted(result.after)
            if result.after[model] != result.before.get(model, 0)
        )
        return (
            f"Rescheduling {result.pods_moved} pod(s) as below frees "
            f"{sum(len(s.whole) for s in result.steps)} whole chip(s): {gains}."
        )
    if all(result.before.get(m, 0) >= limit for m, limit in result.limit.items()):
        return (
            "Nothing to gain: the free capacity is already on whole chips (as many of "
            "the largest template fit as it could hold)."
        )
    return (
        "No rescheduling found that lets more of the largest template fit: the pods "
        "holding the scattered capacity cannot run elsewhere (selectors, affinity, "
        "taints, chip model) or would land where they take as much, under policy "
        f"{result.policy}."
    )


def text(report: dict[str, Any]) -> str:
    fits = report["largestFits"]
    lines = [f"Policy: {report['policy']}. {NOTHING_EVICTED}"]
    for model in sorted(report["largestTemplates"]):
        lines.append(
            f"{model}: {fits['before'].get(model, 0)} more x "
            f"{report['largestTemplates'][model]} fit now, {fits['after'].get(model, 0)} "
            f"after the steps below, {fits['limit'].get(model, 0)} at most"
        )
    out = "\n".join(lines) + f"\n\n{report['summary']}\n"
    if not report["steps"]:
        return out
    rows = []
    for number, step in enumerate(report["steps"], 1):
        whole = ",".join(f"{c['node']}/{c['chip']}" for c in step["wholeChips"]) or "-"
        gain = ", ".join(
            f"{m} {step['largestFits']['before'].get(m, 0)}->{n}"
            for m, n in sorted(step["largestFits"]["after"].items())
            if n != step["largestFits"]["before"].get(m, 0)
        )
        # A step of several pods takes a row each; the step's cells repeat.
        for pod in step["pods"]:
            rows.append(
                [
                    number,
                    f"{step['node']}/{step['chip']}",
                    pod["pod"],
                    f"{pod['count']} x {pod['template']}",
                    _where(pod["from"]),
                    _where(pod["to"]),
                    whole,
                    gain,
                ]
            )
    out += "\n" + table(
        ["STEP", "EMPTIES", "POD", "REQUEST", "FROM", "TO", "WHOLE-CHIPS", "LARGEST"], rows
    )
    out += (
        f"\nTo apply a step: kubectl vnpu cordon NODE CHIP --reason {CORDON_REASON} for the\n"
        "chip it empties; delete its pods in the order listed and create each again (a\n"
        "controller does that itself), waiting until each is placed; after the last step,\n"
        "kubectl vnpu uncordon those chips.\n"
    )
    return out


def _where(place: dict[str, Any]) -> str:
    return f"{place['node']}/{','.join(str(c) for c in place['chips'])}"
