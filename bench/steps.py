"""Where each pod's time went: the steps of its placement and of its release,
timed by the benchmark's watches of the pods (load.Tracker) and of their
allocations (allocclock.AllocationClock), and which step held the slowest.

A pod's created -> ungated is cut at the moments the watches first showed
the pod (the API server's watch fan-out), all its allocations (the operator
placed it), all of them Ready (the agent created the vNPUs) and the pod
ungated (the operator's pin patch); deleted -> gone at the pod deleting, its
containers stopped (kwok), its allocations deleted (the operator released
them), all of them gone (the agent destroyed the vNPUs and removed their
finalizer), the pod finalizer removed (the operator) and the pod gone. The
two watches are separate streams, so a later point may arrive before an
earlier one: each point is taken no earlier than the one before (a step
then counts 0 and the next holds the difference), and a point never seen
(a step that happened inside one event) counts 0 too. The steps of a pod
always add up to its latency.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.allocclock import AllocationClock
from bench.load import PodTimes
from bench.report import pct

Point = Callable[[PodTimes, AllocationClock], float | None]


@dataclass(frozen=True)
class Chain:
    """A latency cut into steps: `points[0]` to `points[-1]`, each step
    named by who does it."""

    name: str
    label: str
    points: Sequence[tuple[str, Point]]
    # Steps around the chain, timed but not part of the latency.
    extra: Sequence[tuple[str, Point, Point]] = ()

    def times(self, pod: PodTimes, clock: AllocationClock) -> list[float] | None:
        """The chain's points for `pod`, each no earlier than the one
        before; None when the first or the last is missing."""
        raw = [at(pod, clock) for _, at in self.points]
        first, last = raw[0], raw[-1]
        if first is None or last is None:
            return None
        out = [first]
        for t in raw[1:-1]:
            out.append(min(last, max(out[-1], t if t is not None else out[-1])))
        out.append(max(out[-1], last))
        return out

    def steps(self, pod: PodTimes, clock: AllocationClock) -> list[float] | None:
        t = self.times(pod, clock)
        return None if t is None else [b - a for a, b in itertools.pairwise(t)]

    @property
    def step_names(self) -> list[str]:
        return [name for name, _ in self.points[1:]]


CREATE = Chain(
    "ungate",
    "created -> ungated",
    [
        ("created", lambda p, c: p.created),
        ("pod seen (API server -> watches)", lambda p, c: p.seen),
        ("allocations created (operator: place)", lambda p, c: c.all_created(p.uid, p.count)),
        ("allocations Ready (agent: vNPUs created)", lambda p, c: c.all_ready(p.uid, p.count)),
        ("pinned and ungated (operator: pod patch)", lambda p, c: p.ungated),
    ],
    [
        ("create call (admission webhooks)", lambda p, c: p.create_sent, lambda p, c: p.created),
        ("pinned -> ungated (one patch: 0)", lambda p, c: p.pinned, lambda p, c: p.ungated),
        ("ungated -> bound (scheduler)", lambda p, c: p.ungated, lambda p, c: p.scheduled),
        ("bound -> Running (kwok)", lambda p, c: p.scheduled, lambda p, c: p.running),
    ],
)
DELETE = Chain(
    "gone",
    "deleted -> gone",
    [
        ("deleted", lambda p, c: p.delete_called),
        ("pod deleting seen (API server -> watches)", lambda p, c: p.terminating),
        ("containers stopped (kwok)", lambda p, c: p.stopped),
        ("allocations deleted (operator: release)", lambda p, c: c.all_deleting(p.uid)),
        ("allocations gone (agent: vNPUs destroyed)", lambda p, c: c.all_gone(p.uid)),
        ("pod finalizer removed (operator)", lambda p, c: p.unfinalized),
        ("pod gone (operator: finalizer; API server)", lambda p, c: p.gone),
    ],
    [("delete call", lambda p, c: p.delete_sent, lambda p, c: p.delete_called)],
)
CHAINS = (CREATE, DELETE)


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p99": pct(values, 99),
        "max": max(values) if values else None,
    }


def slowest(latencies: dict[str, float], share: float = 0.01) -> list[str]:
    """The slowest `share` of the pods (at least one), slowest first: those
    at and above about the p99 latency."""
    n = max(1, math.ceil(share * len(latencies))) if latencies else 0
    return sorted(latencies, key=lambda k: -latencies[k])[:n]


def attribute(chain: Chain, pods: Sequence[PodTimes], clock: AllocationClock) -> dict[str, Any]:
    """Per step, p50/p99/max of its durations over the pods; the slowest 1%
    of pods (at or above the p99 latency) and, for each step, how many of
    them it held longest and its mean there; the slowest pod's steps; and
    each pod's window (for the timeline's overlaps)."""
    per_pod: dict[str, list[float]] = {}
    windows: dict[str, tuple[float, float]] = {}
    for pod in pods:
        t = chain.times(pod, clock)
        if t is None:
            continue
        per_pod[pod.name] = [b - a for a, b in itertools.pairwise(t)]
        windows[pod.name] = (t[0], t[-1])
    names_ = chain.step_names
    total = {k: sum(v) for k, v in per_pod.items()}
    slow = slowest(total)
    held: Counter[str] = Counter(names_[max(range(len(names_)), key=per_pod[k].__getitem__)]
                                 for k in slow)  # fmt: skip
    steps_out = []
    for i, name in enumerate(names_):
        values = [v[i] for v in per_pod.values()]
        in_slow = [per_pod[k][i] for k in slow]
        steps_out.append({
            "step": name, **_summary(values),
            "held_slowest": held.get(name, 0),
            "mean_in_slowest": sum(in_slow) / len(in_slow) if in_slow else None,
        })  # fmt: skip
    extra = []
    for name, start, end in chain.extra:
        values = [
            max(0.0, b - a)
            for p in pods
            if (a := start(p, clock)) is not None and (b := end(p, clock)) is not None
        ]
        extra.append({"step": name, **_summary(values)})
    worst = slow[0] if slow else None
    return {
        "latency": chain.label,
        "total": _summary(list(total.values())),
        "steps": steps_out,
        "around": extra,
        "slowest": {
            "pods": len(slow),
            "at_or_above_s": total[slow[-1]] if slow else None,
            "names": slow[:20],
        },
        "worst": {"pod": worst, "steps": dict(zip(names_, per_pod[worst], strict=True))}
        if worst
        else None,
        "windows": {"all": windows, "slowest": slow},
    }


_POD_STAMPS = (
    "create_sent", "created", "seen", "pinned", "ungated", "scheduled", "running",
    "delete_sent", "delete_called", "terminating", "stopped", "unfinalized", "gone",
)  # fmt: skip


def raw(pods: Sequence[PodTimes], clock: AllocationClock, work: Sequence[Any]) -> dict[str, Any]:
    """Every pod's stamps and its allocations', and the periodic work
    (`timeline.Work`), in seconds from the first pod's creation."""
    t0 = min((p.created for p in pods if p.created is not None), default=0.0)

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 4)

    out_pods = {}
    for p in pods:
        stamps: dict[str, Any] = {k: rel(getattr(p, k)) for k in _POD_STAMPS}
        stamps["allocations"] = {
            what: {name: rel(t) for name, t in table.get(p.uid, {}).items()}
            for what, table in (("created", clock.created), ("ready", clock.ready),
                                ("deleting", clock.deleting), ("gone", clock.gone))
        }  # fmt: skip
        out_pods[p.name] = stamps
    return {
        "zero": "the first churn pod's creation",
        "pods": out_pods,
        "work": [[w.kind, rel(w.start), rel(w.end)] for w in sorted(work, key=lambda w: w.start)],
    }


def attribution(pods: Sequence[PodTimes], clock: AllocationClock) -> dict[str, Any]:
    return {c.name: attribute(c, pods, clock) | {"fallbacks": clock.fallbacks} for c in CHAINS}


def _ms(v: Any) -> str:
    return "-" if v is None else f"{1000 * v:.0f}"


def print_attribution(att: dict[str, Any]) -> None:
    """The table: per step p50/p99/max (ms), how many of the slowest 1% of
    pods it held longest, and its mean among them."""
    for key in ("ungate", "gone"):
        a = att.get(key)
        if not a:
            continue
        t, s = a["total"], a["slowest"]
        print(f"-- where {a['latency']} went, per step (ms; n {t['n']}; slowest 1%: "
              f"{s['pods']} pods at or above {_ms(s['at_or_above_s'])} ms)")  # fmt: skip
        print(f"  {'step':<46} {'p50':>6} {'p99':>6} {'max':>6}  {'held slow':>9} {'mean slow':>9}")
        for st in a["steps"]:
            print(f"  {st['step']:<46} {_ms(st['p50']):>6} {_ms(st['p99']):>6} "
                  f"{_ms(st['max']):>6}  {st['held_slowest']:>9} "
                  f"{_ms(st['mean_in_slowest']):>9}")  # fmt: skip
        print(f"  {'total ' + a['latency']:<46} {_ms(t['p50']):>6} {_ms(t['p99']):>6} "
              f"{_ms(t['max']):>6}")  # fmt: skip
        for st in a["around"]:
            print(f"  ({st['step']})".ljust(49) + f"{_ms(st['p50']):>6} {_ms(st['p99']):>6} "
                  f"{_ms(st['max']):>6}")  # fmt: skip
        w = a.get("worst")
        if w:
            parts = ", ".join(f"{k.split(' (')[0]} {_ms(v)}" for k, v in w["steps"].items() if v)
            print(f"  slowest pod {w['pod']}: {parts}")
