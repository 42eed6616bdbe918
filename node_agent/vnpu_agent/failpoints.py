"""Failpoints: pauses at named steps, for crash tests only.

`VNPU_FAILPOINTS="after-create=30,before-finalizer=10"` makes the agent sleep
that many seconds at those steps, so a test can SIGKILL it in the window
between two writes (e.g. after the vNPU exists, before the status says so).
Unset in production: then each call is a dict lookup.
"""

from __future__ import annotations

import asyncio
import logging
import os

log = logging.getLogger(__name__)


def _parse(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, seconds = part.partition("=")
        try:
            out[name.strip()] = float(seconds)
        except ValueError:
            log.error("ignoring malformed failpoint %r (want name=seconds)", part)
    return out


_POINTS = _parse(os.environ.get("VNPU_FAILPOINTS", ""))


async def failpoint(name: str) -> None:
    seconds = _POINTS.get(name)
    if seconds:
        log.warning("failpoint %s: pausing %.1fs", name, seconds)
        await asyncio.sleep(seconds)
