"""Agent Leases, read by polling rather than watched.

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
import logging
from typing import Any, Protocol

from kubernetes_asyncio import client

from vnpu_operator import names
from vnpu_operator.rawcall import call_json

log = logging.getLogger(__name__)

Raw = dict[str, Any]


class LeaseSink(Protocol):
    def lease_event(self, event_type: str | None, obj: Raw) -> None: ...


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
                backoff = min(self.retry_max, 2 ** min(self._failures, 6) * 0.25)
                log.warning("listing agent Leases failed (retry in %.1fs): %s", backoff, exc)
                delay = backoff
                continue
            self._failures = 0
            delay = self.interval
