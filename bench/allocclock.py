"""When each pod's allocations were created and when they were gone, from a
watch of the allocation objects: what "freed capacity is reused" is measured
between (issue 14: a waiting pod is placed within 1 s of the allocation that
held the capacity disappearing). Timing from the pods' deletion instead adds
the whole release chain in front (operator, agent, driver, finalizer)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from bench.watchloop import StampedWatch
from vnpu_common.wire import names


class AllocationClock(StampedWatch):
    """Per pod UID, when each of its allocation objects was first seen, first
    seen Ready, first seen deleted (deletionTimestamp set: the operator
    released it) and gone (the agent destroyed the vNPU and removed the
    finalizer): the steps bench/steps.py attributes a pod's time to."""

    def __init__(self, custom: client.CustomObjectsApi, namespace: str) -> None:
        lister = partial(
            custom.list_namespaced_custom_object,
            names.GROUP, names.VERSION, namespace, names.ALLOCATION_PLURAL,
        )  # fmt: skip
        super().__init__(f"{namespace} allocations", lister)
        self.created: dict[str, dict[str, float]] = {}
        self.ready: dict[str, dict[str, float]] = {}
        self.deleting: dict[str, dict[str, float]] = {}
        self.gone: dict[str, dict[str, float]] = {}
        # Stamps taken from the object's own (second-precision) timestamps
        # because no event showed the change: a re-list after a broken watch.
        self.fallbacks = 0
        self._offset = time.time() - time.monotonic()

    def stamp(self, kind: str, obj: dict[str, Any], now: float) -> None:
        uid = str((obj.get("spec") or {}).get("podUID") or "")
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not uid or not name:
            return
        self.created.setdefault(uid, {}).setdefault(name, now)
        if (obj.get("status") or {}).get("phase") == names.PHASE_READY:
            self.ready.setdefault(uid, {}).setdefault(name, now)
        if meta.get("deletionTimestamp"):
            deleting = self.deleting.setdefault(uid, {})
            if name not in deleting and kind in ("DELETED", "SYNC"):
                # Deleted (or listed deleting) with no event showing it being
                # deleted: the server's own time, to the second.
                at = _epoch(meta["deletionTimestamp"])
                if at is not None:
                    self.fallbacks += 1
                    deleting[name] = min(now, at - self._offset)
            deleting.setdefault(name, now)
        if kind == "DELETED":
            self.gone.setdefault(uid, {}).setdefault(name, now)

    def all_created(self, uid: str, count: int) -> float | None:
        """When the last of the pod's `count` allocations appeared."""
        return _last(self.created, uid, count)

    def all_ready(self, uid: str, count: int) -> float | None:
        """When the last of the pod's `count` allocations was first seen Ready."""
        return _last(self.ready, uid, count)

    def all_deleting(self, uid: str) -> float | None:
        """When the last of the pod's allocations was first seen deleted
        (None: one was never seen so)."""
        return _last(self.deleting, uid, len(self.created.get(uid, {})) or 1)

    def all_gone(self, uid: str) -> float | None:
        """When the last allocation the pod had was gone (None: one is left)."""
        seen, gone = self.created.get(uid, {}), self.gone.get(uid, {})
        if not seen or set(seen) - set(gone):
            return None
        return max(gone.values())


def _last(stamps: dict[str, dict[str, float]], uid: str, count: int) -> float | None:
    seen = stamps.get(uid, {})
    return max(seen.values()) if len(seen) >= count else None


def _epoch(value: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def reuse_delays(freed_at: Sequence[float | None], taken_at: Sequence[float | None]) -> list[float]:
    """Capacity freed, then taken by waiting pods: the k-th earliest take
    minus the k-th earliest release (a queue's delay when the releases are
    alike, as the fill's are), each at least 0. A release or take that never
    happened leaves its pair out."""
    freed = sorted(t for t in freed_at if t is not None)
    taken = sorted(t for t in taken_at if t is not None)
    return [max(0.0, t - f) for f, t in zip(freed, taken, strict=False)]
