"""The periodic work that might hold a pod, with timestamps, and which of it
overlaps the slowest pods (issue 38: something periodic, not load, sets the
tail).

Two sources, both on the benchmark's clock (wall times turned monotonic):

- the API server's audit log, which the benchmark's plane also writes for
  our components' lists (`AUDIT_POLICY`): the operator's convergence passes
  (metadata lists of pods, allocations, VNPUNodes, Nodes), its other lists,
  its leader Lease writes, the agents' VNPUNode writes (settled ones included),
  Lease renewals and re-lists; each from the request's arrival to its answer;
  and kwok's node Lease renewals where they come in a burst (`bursts`);
- the components' own pause lines (vnpu_common/process/pauses.py, on with
  `VNPU_DEBUG_PAUSES_MS`): their event loop late (busy, or not scheduled
  by the machine) and their garbage collector's long collections; and the
  benchmark's own, whose watches time every step.

For each kind of work: how many of the slowest 1% of pods it overlaps,
against how many of all pods (a kind as likely to overlap any pod does not
explain the slow ones), and how much of a slow pod's window it covers.
"""

from __future__ import annotations

import bisect
import datetime as dt
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import OURS, component
from localplane.policies import AGENT_USER, OPERATOR_USER
from vnpu_common.wire import names

# The plane's policy (localplane/plane.py: writes at Metadata level) and our
# components' lists: the periodic reads of the operator and agents.
AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: Metadata
    users: ["{OPERATOR_USER}", "{AGENT_USER}"]
    verbs: ["list"]
  - level: None
"""
_CONVERGED = frozenset({"pods", names.ALLOCATION_PLURAL, names.NODE_PLURAL, "nodes"})
_PAUSE = re.compile(r"pause kind=(\w+) start=([0-9.]+) ms=([0-9.]+)(.*)$")
_FIELD = re.compile(r"(\w+)=([0-9.+-]+)")


@dataclass(frozen=True)
class Work:
    kind: str
    start: float  # the benchmark's monotonic clock
    end: float


def epoch(value: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def audit_kind(event: Mapping[str, Any]) -> str | None:
    """The periodic work an audit event of ours is part of; None for the
    writes about pods (the steps themselves) and for other clients."""
    who = component(dict(event))
    if who not in OURS.values():
        return None
    ref = event.get("objectRef") or {}
    resource, verb = ref.get("resource"), event.get("verb")
    if verb == "list":
        if who == "operator":
            return "operator: convergence pass (lists)" if resource in _CONVERGED else (
                f"operator: list {resource}")  # fmt: skip
        return f"agents: list {resource} (re-list)"
    if resource == "leases":
        return "operator: leader Lease write" if who == "operator" else "agents: Lease renewal"
    if who == "agent" and resource == names.NODE_PLURAL:
        return "agents: VNPUNode write"
    return None


SETTLED = "agents: VNPUNode write, settled"
KWOK_BURST = "kwok: node Leases renewed in a burst"
# kwok renews every node's Lease in one pass every quarter of the duration
# (10 s): all of them within 2 to 3 s, 60 to 90 writes a second at 200
# nodes, where kubelets started apart renew apart. A burst: writes less
# than BURST_GAP apart, at least BURST_LEAST of them.
BURST_GAP = 0.5
BURST_LEAST = 20


def kwok_lease_write(event: Mapping[str, Any]) -> bool:
    ref = event.get("objectRef") or {}
    return component(dict(event)) == "kwok" and ref.get("resource") == "leases"


def bursts(kind: str, spans: Sequence[tuple[float, float]]) -> list[Work]:
    """Runs of `spans` (sorted by start) less than BURST_GAP apart, each of
    at least BURST_LEAST, as one Work of `kind` from its first start to its
    last end."""
    out: list[Work] = []
    first, end, count = 0.0, float("-inf"), 0
    for start, stop in [*spans, (float("inf"), float("inf"))]:
        if count and start - end >= BURST_GAP:
            if count >= BURST_LEAST:
                out.append(Work(kind, first, end))
            count = 0
        if not count:
            first, end = start, stop
        end = max(end, stop)
        count += 1
    return out


def from_audit(
    events: Iterable[Mapping[str, Any]], offset: float, settle: float | None = None
) -> list[Work]:
    """`offset`: wall clock minus the benchmark's monotonic clock. With the
    agents' `settle` interval, a VNPUNode write that follows the node's
    previous one by that interval (within a second and a half) is told apart
    as settled: a write the interval put off."""
    out = []
    last: dict[str, float] = {}
    kwok: list[tuple[float, float]] = []
    for e in sorted(events, key=lambda e: str(e.get("requestReceivedTimestamp"))):
        kind = audit_kind(e)
        if kind is None and not kwok_lease_write(e):
            continue
        start, end = epoch(e.get("requestReceivedTimestamp")), epoch(e.get("stageTimestamp"))
        if start is None or end is None:
            continue
        if kind is None:
            kwok.append((start - offset, end - offset))
            continue
        if kind == "agents: VNPUNode write" and settle is not None:
            node = str((e.get("objectRef") or {}).get("name"))
            before = last.get(node)
            if before is not None and abs(start - before - settle) <= 1.5:
                kind = SETTLED
            last[node] = start
        out.append(Work(kind, start - offset, end - offset))
    return out + bursts(KWOK_BURST, kwok)


def pause_kind(who: str, kind: str, fields: Mapping[str, float]) -> str:
    if kind == "gc":
        return f"{who}: GC generation {int(fields.get('gen', -1))}"
    busy = fields.get("cpu_ms", 0.0) >= 0.5 * fields.get("ms", 0.0)
    return f"{who}: loop {'busy' if busy else 'not scheduled'}"


def from_pause_lines(who: str, lines: Iterable[str], offset: float) -> list[Work]:
    out = []
    for line in lines:
        m = _PAUSE.search(line)
        if m is None:
            continue
        fields = {k: float(v) for k, v in _FIELD.findall(m.group(4))}
        fields["ms"] = ms = float(m.group(3))
        start = float(m.group(2)) - offset
        out.append(Work(pause_kind(who, m.group(1), fields), start, start + ms / 1000))
    return out


def from_logs(logs: Iterable[tuple[str, Path]], offset: float) -> list[Work]:
    """Pause lines of each component's log: (who, path) pairs."""
    out = []
    for who, path in logs:
        if path.exists():
            with open(path, errors="replace") as f:
                out += from_pause_lines(who, (line for line in f if "pause kind=" in line), offset)
    return out


class PauseLog(logging.Handler):
    """The benchmark's own pause lines (its loop runs pauses.watch)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def covered(merged: Sequence[tuple[float, float]], a: float, b: float) -> float | None:
    """How much of [a, b] the merged spans cover; None: they do not touch it."""
    i = max(0, bisect.bisect_right(merged, (a, float("inf"))) - 1)
    total, touched = 0.0, False
    while i < len(merged) and merged[i][0] <= b:
        lo, hi = max(a, merged[i][0]), min(b, merged[i][1])
        if hi >= lo:
            total += hi - lo
            touched = True
        i += 1
    return total if touched else None


def overlaps(
    work: Sequence[Work],
    windows: Mapping[str, tuple[float, float]],
    slow: Sequence[str],
    limit: int = 20,
) -> dict[str, Any]:
    """Per kind of work: events within the pods' span, the share of that
    span it covers, the share of the slowest pods and of all pods it
    overlaps, and the mean of a slow pod's window it covers; and, for the
    slowest pods, the work that overlaps each (ms covered)."""
    if not windows:
        return {"kinds": [], "pods": {}}
    lo = min(a for a, _ in windows.values())
    hi = max(b for _, b in windows.values())
    by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for w in work:
        if w.end >= lo and w.start <= hi:
            by_kind[w.kind].append((w.start, w.end))
    span = max(hi - lo, 1e-9)
    rows: list[dict[str, Any]] = []
    per_pod: dict[str, dict[str, float]] = defaultdict(dict)
    for kind, spans in by_kind.items():
        merged = _union(spans)
        hit_all = sum(1 for a, b in windows.values() if covered(merged, a, b) is not None)
        slow_cov = []
        for name in slow:
            c = covered(merged, *windows[name])
            if c is not None:
                slow_cov.append(c)
                if len(per_pod) < limit or name in per_pod:
                    per_pod[name][kind] = round(1000 * c, 1)
        share_slow = len(slow_cov) / len(slow) if slow else None
        share_all = hit_all / len(windows)
        rows.append({
            "kind": kind, "events": len(spans),
            "time_share": sum(min(b, hi) - max(a, lo) for a, b in merged) / span,
            "slow_share": share_slow, "all_share": share_all,
            "lift": share_slow / share_all if share_slow is not None and share_all else None,
            "mean_ms_in_slow": 1000 * sum(slow_cov) / len(slow) if slow else None,
        })  # fmt: skip
    rows.sort(key=lambda r: -((r["slow_share"] or 0) - r["all_share"]))
    pods = {name: per_pod.get(name, {}) for name in slow[:limit]}
    return {"kinds": rows, "pods": pods}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def print_overlaps(label: str, result: Mapping[str, Any], rows: int = 14) -> None:
    kinds = result.get("kinds") or []
    if not kinds:
        return
    print(f"-- periodic work during {label}: share of the slowest 1% it overlaps vs of all pods")
    print(f"  {'work':<44} {'events':>6} {'time':>5} {'slow':>5} {'all':>5} {'lift':>5} "
          f"{'ms/slow':>7}")  # fmt: skip
    for r in kinds[:rows]:
        lift = "-" if r["lift"] is None else f"{r['lift']:.1f}"
        mean = "-" if r["mean_ms_in_slow"] is None else f"{r['mean_ms_in_slow']:.0f}"
        shares = f"{_pct(r['slow_share']):>5} {_pct(r['all_share']):>5}"
        print(f"  {r['kind']:<44} {r['events']:>6} {_pct(r['time_share']):>5} "
              f"{shares} {lift:>5} {mean:>7}")  # fmt: skip
    for name, hits in list((result.get("pods") or {}).items())[:5]:
        top = sorted(hits.items(), key=lambda kv: -kv[1])[:4]
        print(f"  {name}: " + (", ".join(f"{k} {v:.0f} ms" for k, v in top) or "nothing"))
