"""A node serves one front-end (docs/DRA.md, "Why one mode per node"), and an
agent does not switch a node between them while it holds live allocations of
the other kind.

With `--dra` the node's annotated pods would lose the operator's placement of
their successors and gain a pool the scheduler books beside them; without it,
the node's claims would lose their kubelet plugin: no Unprepare ever comes,
so their vNPUs could never be released. Either way the switch is refused: the
agent names the allocations and exits, leaving every vNPU and allocation as it
was, until the pods are drained or the flag is put back.
"""

from __future__ import annotations

from collections.abc import Iterable

from vnpu_agent.allocation import AllocationView
from vnpu_common.wire.types import Raw

# How many allocations the refusal names; the rest are counted.
NAMED = 5


class ModeConflictError(Exception):
    """The agent's mode and the node's live allocations disagree."""


def conflict(node: str, dra: bool, allocs: Iterable[Raw]) -> str | None:
    """Why the agent may not serve `node` in this mode, or None: the live
    (not being deleted) allocations of the other front-end on the node."""
    others = sorted(
        a.key
        for a in map(AllocationView.of, allocs)
        if a.node == node and not a.deleting and a.dra != dra
    )
    if not others:
        return None
    named = ", ".join(others[:NAMED]) + (
        f" and {len(others) - NAMED} more" if len(others) > NAMED else ""
    )
    if dra:
        return (
            f"node {node} holds {len(others)} live allocation(s) of annotated pods ({named}): "
            "the agent does not switch it to DRA (--dra) while they run. Delete those pods "
            "(or drain the node) first, or start the agent without --dra"
        )
    return (
        f"node {node} holds {len(others)} live allocation(s) of ResourceClaims ({named}): "
        "without --dra nothing would unprepare them and their vNPUs could never be released. "
        "Delete the pods that use those claims (or drain the node) first, or start the agent "
        "with --dra"
    )
