"""Where the fill's freed -> placed delay goes: the operator, or the API server.

The fill frees pods and times each waiting pod's placement from the capacity
freed (the k-th capacity freed paired with the k-th placement: alike pods,
so a queue's delay). The audit log splits each pair at the moment the
operator sent the waiting pod's first allocation create: before it, the
operator (the freed allocations' watch events reaching it, its queue, the
placement); after it, the API server (the creates served and watched back).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench import report
from bench.allocclock import reuse_delays
from bench.timeline import epoch
from localplane.policies import OPERATOR_USER
from vnpu_common import names


def creates_sent(
    events: Iterable[Mapping[str, Any]], pods: Sequence[str], offset: float
) -> dict[str, float]:
    """Pod name -> when the operator sent its first allocation create (the
    benchmark's monotonic clock; `offset`: wall clock minus it). The
    operator names a pod's allocations `<pod>-<suffix>-<index>`."""
    wanted = set(pods)
    out: dict[str, float] = {}
    for e in events:
        ref = e.get("objectRef") or {}
        if (
            e.get("verb") != "create"
            or ref.get("resource") != names.ALLOCATION_PLURAL
            or (e.get("user") or {}).get("username") != OPERATOR_USER
        ):
            continue
        pod = str(ref.get("name", "")).rsplit("-", 2)[0]
        wall = epoch(e.get("requestReceivedTimestamp"))
        if pod in wanted and wall is not None:
            sent = wall - offset
            out[pod] = min(out.get(pod, sent), sent)
    return out


def split(
    freed_at: Sequence[float | None],
    sent_at: Sequence[float | None],
    taken_at: Sequence[float | None],
) -> dict[str, Any]:
    """The pairs' delay in two: freed -> creates sent (the operator) and
    creates sent -> placed (the API server), each paired k-th with k-th."""
    return {
        "gone_to_creates_sent": report.summary(reuse_delays(freed_at, sent_at), (50, 99)),
        "creates_sent_to_placed": report.summary(reuse_delays(sent_at, taken_at), (50, 99)),
    }
