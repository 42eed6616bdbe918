"""Where the fill's freed -> placed delay goes: the operator, or the API server.

The fill frees pods and times each waiting pod's placement from the capacity
freed (the k-th capacity freed paired with the k-th placement: alike pods,
so a queue's delay). The audit log splits each pair at the moment the
operator sent the waiting pod's first allocation create: before it, the
operator (the freed allocations' watch events reaching it, its queue, the
placement); after it, the API server (the creates served and watched back).

The benchmark's own watch stamps both ends late when the machine is busy
(on 2 cores at 1000 nodes, 1.5 to 2.5 s behind the API server's commits),
and by different amounts as its backlog grows. `committed` reads both ends
from the audit log instead: the capacity freed when the agent's finalizer
removal of a freed pod's last allocation was served (the object goes with
it), the pod placed when the operator's last create for it was served.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench import report
from bench.allocclock import reuse_delays
from bench.timeline import epoch
from localplane.policies import AGENT_USER, OPERATOR_USER
from vnpu_common.wire import names


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


def committed(
    events: Iterable[Mapping[str, Any]],
    freed: Sequence[str],
    waiting: Sequence[str],
    count: int,
    offset: float,
) -> tuple[dict[str, float], dict[str, float]]:
    """(freed pod -> when the agent's last finalizer removal of its
    allocations was served, waiting pod -> when the operator's last create
    for it was served), on the benchmark's monotonic clock (`offset`: wall
    clock minus it); `count`: each pod's allocations. A pod with fewer than
    `count` of its allocations released (or created) in `events` is left
    out: its capacity was not all freed (it was not all placed) there."""
    freed_set, waiting_set = set(freed), set(waiting)
    released: dict[str, dict[str, float]] = {}
    created: dict[str, dict[str, float]] = {}
    for e in events:
        ref = e.get("objectRef") or {}
        if ref.get("resource") != names.ALLOCATION_PLURAL or ref.get("subresource"):
            continue
        code = (e.get("responseStatus") or {}).get("code", 200)
        served = epoch(e.get("stageTimestamp"))
        if served is None or not 200 <= int(code) < 300:
            continue
        name = str(ref.get("name", ""))
        pod = name.rsplit("-", 2)[0]
        user = (e.get("user") or {}).get("username")
        if e.get("verb") == "patch" and user == AGENT_USER and pod in freed_set:
            done = released.setdefault(pod, {})
            done[name] = max(done.get(name, served), served)
        elif e.get("verb") == "create" and user == OPERATOR_USER and pod in waiting_set:
            made = created.setdefault(pod, {})
            made[name] = max(made.get(name, served), served)
    return (
        {pod: max(t.values()) - offset for pod, t in released.items() if len(t) >= count},
        {pod: max(t.values()) - offset for pod, t in created.items() if len(t) >= count},
    )


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
