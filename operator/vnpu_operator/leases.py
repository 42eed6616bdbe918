"""Agent Leases: read by polling rather than watched, and turned into
whether each node's agent is live.

Every agent renews its node's Lease a few times per Lease duration; at 200
nodes that is about 15 watch events a second, each going through Kopf's
per-event machinery (about 2 ms) to tell the operator what it can already
compute: a Lease runs out at renewTime + leaseDurationSeconds, and the
controller arms a timer for that moment. One LIST of the agents' namespace
every few seconds keeps those expiries current for a few milliseconds of
decoding. What polling delays is only noticing a node that came back (by at
most one interval). The interval never exceeds a quarter of the shortest
Lease duration seen, so a Lease is always read again well before the last
renewal read could run out.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes_asyncio import client

from vnpu_common import names
from vnpu_common.backoff import Backoff
from vnpu_common.rawcall import call_json
from vnpu_common.types import Raw

log = logging.getLogger(__name__)


class LeaseSink(Protocol):
    def lease_event(self, event_type: str | None, obj: Raw) -> None: ...


def parse_time(value: Any) -> float | None:
    """Epoch seconds of a Kubernetes timestamp (Time or MicroTime)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class LeaseLiveness:
    """Which nodes' agents are live: an agent is live until its Lease's
    renewTime + leaseDurationSeconds + grace. `changed(node)` is called when
    that answer flips: on a renewal read after an expiry, on a Lease that
    appears or goes, and by a timer at the moment a Lease runs out (no
    renewal may ever arrive to tell)."""

    def __init__(
        self,
        namespace: str,
        grace_seconds: float,
        changed: Callable[[str], None],
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.namespace = namespace
        self.grace = grace_seconds
        self.changed = changed
        self.wall = wall
        self.expiry: dict[str, float] = {}
        self._reported: dict[str, bool] = {}
        self._read: dict[str, tuple[Any, Any, Any]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._armed_for: dict[str, float] = {}

    def live(self, node: str) -> bool:
        return self.expiry.get(node, 0.0) > self.wall()

    def lease_event(self, event_type: str | None, obj: Raw) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if meta.get("namespace") != self.namespace or not name.startswith(names.LEASE_PREFIX):
            return
        node = name[len(names.LEASE_PREFIX) :]
        spec = obj.get("spec") or {}
        read = (spec.get("renewTime"), spec.get("acquireTime"), spec.get("leaseDurationSeconds"))
        if event_type != "DELETED" and self._read.get(node) == read:
            # Each poll reads every Lease again; one not renewed since the
            # last read moves nothing but may have run out meanwhile.
            self._report(node)
            return
        renewed = parse_time(read[0]) or parse_time(read[1])
        duration = read[2] or 0
        if event_type == "DELETED" or renewed is None or not isinstance(duration, int):
            self.expiry.pop(node, None)
            self._read.pop(node, None)
            self._cancel_timer(node)
        else:
            expiry = renewed + duration + self.grace
            self.expiry[node] = expiry
            self._read[node] = read
            self._arm_timer(node, expiry)
        self._report(node)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._armed_for.clear()

    def _report(self, node: str) -> None:
        # A renewal that leaves the node as live as it was changes nothing
        # placement reads; at hundreds of nodes these are most Lease reads.
        now = self.live(node)
        if self._reported.get(node) != now:
            self._reported[node] = now
            self.changed(node)

    def _cancel_timer(self, node: str) -> None:
        self._armed_for.pop(node, None)
        old = self._timers.pop(node, None)
        if old is not None:
            old.cancel()

    def _arm_timer(self, node: str, expiry: float) -> None:
        # A renewal only moves the expiry later: the timer armed for the
        # earlier one stays, and on firing arms itself again for the expiry
        # read since. So a node costs one timer per Lease duration, not one
        # per poll (at 2000 nodes re-arming on every read was a tenth of the
        # operator's CPU, idle).
        armed = self._armed_for.get(node)
        if armed is not None and armed <= expiry:
            return
        self._cancel_timer(node)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(expiry - self.wall(), 0) + 0.1
        self._timers[node] = loop.call_later(delay, self._expired, node)
        self._armed_for[node] = expiry

    def _expired(self, node: str) -> None:
        self._timers.pop(node, None)
        self._armed_for.pop(node, None)
        expiry = self.expiry.get(node)
        if expiry is not None and expiry > self.wall():
            self._arm_timer(node, expiry)
        self._report(node)


class LeasePoller:
    def __init__(
        self,
        api: client.CoordinationV1Api,
        namespace: str,
        sink: LeaseSink,
        *,
        interval: float = 5.0,
        retry_max: float = 30.0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.sink = sink
        self.max_interval = interval
        self.retry_max = retry_max
        self.known: set[str] = set()
        self.listed = asyncio.Event()
        self.polls = 0
        self.errors = 0
        self._failures = 0
        self._backoff = Backoff(cap=retry_max)
        self._shortest: float | None = None

    @property
    def interval(self) -> float:
        if self._shortest is None:
            return self.max_interval
        return max(min(self.max_interval, self._shortest / 4), 0.25)

    async def poll(self) -> None:
        """One LIST; every agent Lease in it is fed to the sink, and Leases
        gone since the last poll are fed as DELETED."""
        listed = await call_json(self.api.list_namespaced_lease, self.namespace)
        seen: set[str] = set()
        shortest: float | None = None
        for item in listed.get("items") or []:
            name = str((item.get("metadata") or {}).get("name", ""))
            if not name.startswith(names.LEASE_PREFIX):
                continue
            seen.add(name)
            duration = (item.get("spec") or {}).get("leaseDurationSeconds")
            if isinstance(duration, int) and duration > 0:
                shortest = duration if shortest is None else min(shortest, duration)
            self.sink.lease_event(None, item)
        for name in sorted(self.known - seen):
            self.sink.lease_event(
                "DELETED", {"metadata": {"name": name, "namespace": self.namespace}}
            )
        self.known = seen
        self._shortest = shortest
        self.polls += 1
        self.listed.set()

    async def run(self) -> None:
        """Polls until cancelled; failures are logged and retried with
        backoff, and the Leases keep the expiries last read meanwhile."""
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                self._failures += 1
                delay = self._backoff.delay(self._failures)
                log.warning("listing agent Leases failed (retry in %.1fs): %s", delay, exc)
                continue
            self._failures = 0
            delay = self.interval
