"""`kubectl vnpu cordon|uncordon NODE CHIP`: the one write the plugin makes,
the VNPUNode's `spec.cordonedChips` (issue 15, item 2; docs/DECISIONS.md,
"Cordon a chip", describes the write this wraps).

Read the VNPUNode, build the new list, send one JSON merge patch carrying the
read's resourceVersion: two admins cordoning different chips of a node at
once get a 409 and read again, instead of one list overwriting the other.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import ValidationError

from vnpu_cli.errors import CliError
from vnpu_common.wire import names
from vnpu_common.wire.models import CordonedChip, VNPUNodeSpec
from vnpu_common.wire.types import Raw

# Conflicting writers of one node's cordon list: more than a few in a row is
# not a race any more but something to look at. Each round of a race has one
# winner, so N writers at once need up to N attempts; the jittered pause
# between attempts spreads writers that keep colliding (six at once, without
# it, exhausted five attempts now and then).
ATTEMPTS = 8
RETRY_PAUSE_S = 0.05


def retry_pause(attempt: int) -> float:
    """Seconds to wait before attempt `attempt` (1 for the first retry):
    random, at most RETRY_PAUSE_S x `attempt` (1.4 s over all eight)."""
    return random.uniform(0, RETRY_PAUSE_S * attempt)


def current(vnpu_node: Raw) -> list[CordonedChip]:
    """The cordon list as the object holds it; CliError when it is malformed
    (the CRD's schema should have refused that)."""
    name = (vnpu_node.get("metadata") or {}).get("name")
    try:
        return VNPUNodeSpec.model_validate(vnpu_node.get("spec") or {}).cordoned_chips
    except ValidationError as exc:
        raise CliError(f"VNPUNode {name} has an unreadable spec.cordonedChips: {exc}") from exc


def changed(entries: list[CordonedChip], chip: int, reason: str | None) -> list[CordonedChip]:
    """`entries` with `chip` cordoned for `reason` (replacing an earlier
    reason), or uncordoned when `reason` is None; order kept, by chip."""
    kept = [e for e in entries if e.chip != chip]
    if reason is not None:
        try:
            kept.append(CordonedChip(chip=chip, reason=reason))
        except ValidationError as exc:
            problems = "; ".join(str(e["msg"]) for e in exc.errors())
            raise CliError(
                f"cannot cordon chip {chip}: {problems} (chip 0..1023, reason 1.."
                f"{names.CORDON_REASON_MAX_LEN} characters)"
            ) from exc
    return sorted(kept, key=lambda e: e.chip)


def patch_body(vnpu_node: Raw, entries: list[CordonedChip]) -> dict[str, Any] | list[Raw]:
    """The patch replacing the list, guarded by the spec as read: a JSON Patch
    that tests it, so the agent's status writes (every vNPU made or destroyed)
    do not conflict with it. A VNPUNode with no spec yet gets a merge patch
    guarded by the read's resourceVersion (JSON Patch cannot test absence)."""
    listed = [e.to_api() for e in entries]
    spec = vnpu_node.get("spec")
    if spec is None:
        version = (vnpu_node.get("metadata") or {}).get("resourceVersion")
        return {"metadata": {"resourceVersion": version}, "spec": {"cordonedChips": listed}}
    return [
        {"op": "test", "path": "/spec", "value": spec},
        {"op": "add", "path": "/spec/cordonedChips", "value": listed},
    ]


def outcome(node: str, chip: int, reason: str | None, before: list[CordonedChip]) -> str:
    """The sentence kubectl would print, e.g. `vnpunode/n1 chip 3 cordoned`."""
    was = next((e for e in before if e.chip == chip), None)
    where = f"{names.NODE_SINGULAR}/{node} chip {chip}"
    if reason is None:
        return f"{where} uncordoned" if was is not None else f"{where} was not cordoned"
    if was is not None and was.reason == reason:
        return f"{where} already cordoned ({reason})"
    return f"{where} cordoned ({reason})"


def report(node: str, chip: int, message: str, entries: list[CordonedChip]) -> dict[str, Any]:
    return {
        "node": node,
        "chip": chip,
        "message": message,
        "cordonedChips": [e.to_api() for e in entries],
    }


def text(result: dict[str, Any]) -> str:
    return f"{result['message']}\n"
