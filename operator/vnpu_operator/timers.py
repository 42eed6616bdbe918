"""Pods reconciled again after a delay: one timer per pod.

Preemption retries after a backoff, and a pod held back at its pin is told
why once the hold has lasted; neither has an event to wait for, so each arms
a timer that kicks the pod. A timer that fired is forgotten: `armed(uid)`
False means no kick is coming.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class KickTimers:
    def __init__(self, kick: Callable[[str], None]) -> None:
        """`kick(uid)`: reconcile the pod (read at each firing, so that the
        wiring may set what it calls after construction)."""
        self._kick = kick
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def arm(self, uid: str, delay: float) -> None:
        """Kicks the pod after `delay` seconds, replacing its timer if any."""
        self.cancel(uid)
        # No loop: a test driving a step by hand; nothing to schedule.
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            self._timers[uid] = loop.call_later(delay, self._due, uid)

    def armed(self, uid: str) -> bool:
        return uid in self._timers

    def cancel(self, uid: str) -> None:
        timer = self._timers.pop(uid, None)
        if timer is not None:
            timer.cancel()

    def _due(self, uid: str) -> None:
        self._timers.pop(uid, None)
        self._kick(uid)
