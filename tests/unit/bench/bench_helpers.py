"""What several benchmark tests build alike."""

from __future__ import annotations

import asyncio

from bench.load import Tracker


def bare_tracker(gate: str = "g") -> Tracker:
    """A pod tracker with no watch behind it: tests stamp its events."""
    t = Tracker.__new__(Tracker)
    t.gate = gate
    t.pods = {}
    t.early_ungated = {}
    t.early_gone = {}
    t.changed = asyncio.Event()
    t.stop_waiters = {}
    return t
