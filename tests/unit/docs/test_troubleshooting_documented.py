"""docs/TROUBLESHOOTING.md explains every reason a waiting pod can be given:
each per-node placement reason (as `kubectl vnpu why` and the condition word
it) and each reason the operator sets on the vnpu.io/Allocated condition."""

from __future__ import annotations

import re
from pathlib import Path

from vnpu_common.wire import names
from vnpu_operator.placement.reasons import Reason

DOC = Path(__file__).resolve().parents[3] / "docs" / "TROUBLESHOOTING.md"

# The condition reasons of a pod that waits or was given up on (placing.py,
# controller.py); VNPUsReady and the others are Events only.
CONDITION_REASONS = (
    names.REASON_WAITING,
    names.REASON_INVALID_REQUEST,
    names.REASON_ALLOCATION_FAILED,
    names.REASON_PINNING_FAILED,
    names.REASON_PLACEMENT_CONFLICT,
    names.REASON_WRITE_REFUSED,
    names.REASON_API_ERROR,
)


def _first_cells() -> set[str]:
    """Backticked words in the first cell of every table row."""
    cells: set[str] = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| "):
            first = line.split("|")[1]
            cells.update(re.findall(r"`([^`]+)`", first))
    return cells


def test_every_placement_reason_has_a_row() -> None:
    missing = {r.label for r in Reason} - _first_cells()
    assert missing == set()


def test_every_condition_reason_has_a_row() -> None:
    assert set(CONDITION_REASONS) - _first_cells() == set()
