"""docs/USAGE.md's lists of Event reasons are the ones the code emits."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

from vnpu_agent import drivers
from vnpu_agent.drivers import base
from vnpu_common.wire import names

USAGE = Path(__file__).resolve().parents[3] / "docs" / "USAGE.md"


def _listed(after: str) -> set[str]:
    """Backticked words from `after` up to the end of that sentence."""
    text = " ".join(USAGE.read_text().split())
    start = text.index(after) + len(after)
    sentence = text[start : text.index(". ", start)]
    return set(re.findall(r"`([A-Za-z]+)`", sentence))


def _driver_reasons() -> set[str]:
    # Every driver module, so that no error class escapes by not being imported.
    for module in pkgutil.iter_modules(drivers.__path__):
        importlib.import_module(f"{drivers.__name__}.{module.name}")
    found: set[str] = set()
    todo: list[type[base.DriverError]] = [base.DriverError]
    while todo:
        cls = todo.pop()
        found.add(cls.reason)
        todo.extend(cls.__subclasses__())
    return found


def test_pod_events_in_the_usage_guide_are_exactly_the_operators() -> None:
    assert _listed("Events on pods (the operator):") == set(names.POD_EVENT_REASONS)


def test_allocation_events_in_the_usage_guide_are_exactly_the_agents() -> None:
    expected = set(names.ALLOCATION_EVENT_REASONS) | _driver_reasons()
    assert _listed("Events on allocations (the agent,") == expected


def test_every_reason_constant_is_in_a_list() -> None:
    # A REASON_ constant added without listing it where users read is caught here
    # (condition-only reasons excepted: they show in `kubectl describe`, not Events).
    condition_only = {
        names.REASON_ALLOCATED,
        names.REASON_CREATED,
        names.REASON_ADOPTED,
        names.REASON_DRIVER_READY,
    }
    constants = {v for k, v in vars(names).items() if k.startswith("REASON_")}
    listed = set(names.POD_EVENT_REASONS) | set(names.ALLOCATION_EVENT_REASONS)
    assert constants - condition_only == listed
