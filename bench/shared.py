"""`python -m bench.shared` (`make bench-shared`): the shared cluster, vNPU
pods living among many ordinary pods (issue 58, items 1 and 3).

One plane: `--nodes` kwok nodes x 8 simulated chips served by agent
processes (one per `--nodes-per-agent` nodes), the operator, and
`--ordinary-nodes` kwok nodes without chips, labelled for the ordinary pods
alone. Phases:

1. fill: `--live` vNPU pods of the churn's mix (bench/load.py) created
   through the webhook as fast as `--concurrency` allows, until every one is
   ungated: the fill rate;
2. ordinary: `--ordinary` plain pods (no vNPU annotation, so no webhook
   call) on the ordinary nodes, likewise, until Running;
3. window A: a vNPU churn of `--churn-pods` pods at `--rate`/s, each held
   `--hold` s, and nothing else; window B: the same churn while ordinary
   pods are deleted and replaced at `--ordinary-rate`/s. Per window: CPU by
   process, created -> ungated, created -> Running and deleted -> gone of
   the churn pods, each component's watch events and bytes (its own watch
   parameters, bench/watchcount.py), and in B every ordinary-pod event the
   API server delivered (a watch of their namespace counts them) and the
   replacements' created -> Running, the plain pod's floor in the same
   run. The operator's pod watch selects `vnpu.io/managed=true`, so an
   ordinary pod should cost it nothing: (B - A) operator CPU per ordinary
   event says what it does cost. The two windows last as long as their
   vNPU churn, which is the same;
4. cold start at `--live` live allocations: the operator stopped (SIGTERM)
   and started again: process start -> /readyz 200 -> a new pod placed, its
   RSS then;
5. failover: two replicas (the product's election settings) behind a
   webhook proxy (bench/failover.py), the leader SIGKILLed while pods are
   created: kill -> the next new pod ungated, creates refused.

Then the correctness snapshot (bench/snapshot.py), with the live pods still
there: double-booked vNPU ids, over-committed chips, vNPUs the simulators
hold without an allocation, allocations of no live pod. Exits 1 if a
correctness counter is not 0, never on timing. The API server's CPU
includes the benchmark's own watches (its pod trackers, the counting
watches), in both windows alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench import failover, load, report, snapshot, watchcount
from bench.cluster import OPERATOR_SETTINGS, Cluster, stats
from bench.run import CpuWindow, add_plane_args, on_plane
from localplane.components import ServiceProcess
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_agent.drivers.sim.state import SimState
from vnpu_common.kube.informer import SYNC
from vnpu_common.wire import names
from vnpu_operator.config import OperatorSettings
from vnpu_operator.leases import parse_time

VNPU_NS = "bench"
ORDINARY_NS = "bench-ordinary"
FAILOVER_NS = "bench-failover"
ORDINARY_APP = "vnpu-bench-ordinary"
# The ordinary nodes' label, which the ordinary pods select: the vNPU nodes
# keep the vNPU pods alone, as a node pool of their own would.
POOL_LABEL = "bench.vnpu.io/pool"
POOL_ORDINARY = "ordinary"
ORDINARY_NODE_PREFIX = "on-"
# Of a kwok node's 250 pod slots (localplane.nodes.NodeSpec), the ordinary
# pods take at most this many: window B's replacements are created before
# the pods they replace are gone.
ORDINARY_PODS_PER_NODE = 200
PROBE_TEMPLATE = "vir05_1c_16g"
PROBE_RETRY_S = 30.0
WINDOWS = ("a", "b")


def say(msg: str) -> None:
    print(f"[bench-shared {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- sizes -------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    nodes: int
    live: int
    ordinary: int
    churn_pods: int
    rate: float
    ordinary_rate: float


# Default: 2 cores in under 20 minutes, the 1:2 of vNPU to ordinary
# pods. At 10 plain pods/s Kubernetes alone took about a core of 2 (bench/
# results.json's baseline: ~100 ms of CPU per plain pod), so the ordinary
# churn leaves the vNPU churn the other. --large: a 16-core machine.
SIZES = {
    "default": Size(nodes=200, live=2000, ordinary=4000, churn_pods=240, rate=4.0,
                    ordinary_rate=10.0),
    "large": Size(nodes=1000, live=10000, ordinary=20000, churn_pods=1200, rate=20.0,
                  ordinary_rate=50.0),
}  # fmt: skip


def ordinary_nodes_for(pods: int) -> int:
    return max(1, math.ceil(pods / ORDINARY_PODS_PER_NODE))


def agents_for(nodes: int, per_agent: int) -> int:
    return max(1, math.ceil(nodes / max(1, per_agent)))


def ordinary_node_names(count: int) -> list[str]:
    return [f"{ORDINARY_NODE_PREFIX}{i:04d}" for i in range(count)]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; a size not given comes from --large or the default."""
    p = argparse.ArgumentParser(prog="python -m bench.shared", description=__doc__.split("\n\n")[0])
    p.add_argument("--large", action="store_true",
                   help="1000 vNPU nodes, 10000 live vNPU pods, 20000 ordinary pods "
                        "(a 16-core machine)")  # fmt: skip
    p.add_argument("--nodes", type=int, default=None, help="vNPU nodes (x 8 chips)")
    p.add_argument("--live", type=int, default=None, help="live vNPU pods (the fill)")
    p.add_argument("--ordinary", type=int, default=None, help="ordinary (plain) pods")
    p.add_argument("--ordinary-nodes", type=int, default=None,
                   help=f"nodes without chips for the ordinary pods (default: one per "
                        f"{ORDINARY_PODS_PER_NODE} ordinary pods)")  # fmt: skip
    p.add_argument("--nodes-per-agent", type=int, default=250, help="vNPU nodes per agent process")
    p.add_argument("--churn-pods", type=int, default=None, help="vNPU pods of each window's churn")
    p.add_argument("--rate", type=float, default=None, help="churn vNPU pods created per second")
    p.add_argument("--hold", type=float, default=20.0, help="seconds each churn pod lives")
    p.add_argument("--ordinary-rate", type=float, default=None,
                   help="ordinary pods deleted and replaced per second in window B")  # fmt: skip
    p.add_argument("--failover-rate", type=float, default=4.0,
                   help="vNPU pods created per second around the leader's SIGKILL")  # fmt: skip
    p.add_argument("--keep", action="store_true",
                   help="keep the plane's directory and logs (a temporary one unless "
                        "--workdir)")  # fmt: skip
    add_plane_args(p)
    p.set_defaults(timeout=600.0)
    args = p.parse_args(argv)
    size = SIZES["large" if args.large else "default"]
    for key in ("nodes", "live", "ordinary", "churn_pods", "rate", "ordinary_rate"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(size, key))
    if args.ordinary_nodes is None:
        args.ordinary_nodes = ordinary_nodes_for(args.ordinary)
    args.agents = agents_for(args.nodes, args.nodes_per_agent)
    if args.keep and args.workdir is None:
        args.workdir = Path(tempfile.mkdtemp(prefix="vnpu-bench-shared-"))
    return args


# -- the pods ------------------------------------------------------------------


class OrdinaryDriver(load.Driver):
    """Plain pods (no vNPU annotation: the webhook's match condition skips
    them) on the ordinary nodes."""

    def manifest(self, name: str, template: str, count: int) -> dict[str, Any]:
        return vnpu_pod(
            name, self.namespace, template=None, labels={"app": ORDINARY_APP},
            node_selector={POOL_LABEL: POOL_ORDINARY},
        )  # fmt: skip


class CountingTracker(load.Tracker):
    """A pod tracker that also counts the watch events it received by type:
    every create, update and delete the API server delivers about these
    pods to any watcher of them (a re-list's SYNC apart)."""

    def __init__(self, core: client.CoreV1Api, namespace: str, gate: str) -> None:
        super().__init__(core, namespace, gate)
        self.events: Counter[str] = Counter()

    def stamp(self, kind: str, obj: dict[str, Any], now: float) -> None:
        if kind != SYNC:
            self.events[kind] += 1
        super().stamp(kind, obj, now)


@dataclass
class Recycler:
    """Window B's ordinary churn: each step deletes the oldest live ordinary
    pod and creates its replacement, so the count stays as it was. Names
    never repeat (a replacement is not held up by its predecessor's
    deletion). The live pods outnumber a window's steps, so a pod is never
    deleted before it was created."""

    live: deque[load.PodTimes]
    prefix: str
    created: list[load.PodTimes] = field(default_factory=list)
    deleted: list[load.PodTimes] = field(default_factory=list)

    def step(self) -> tuple[load.PodTimes, load.PodTimes]:
        old = self.live.popleft()
        new = load.PodTimes(f"{self.prefix}-{len(self.created):06d}", "", 0)
        self.live.append(new)
        self.created.append(new)
        self.deleted.append(old)
        return old, new


async def ordinary_churn(
    driver: load.Driver, recycler: Recycler, rate: float, stop: asyncio.Event
) -> None:
    """Recycler steps at `rate`/s until `stop`, then waits for the calls."""
    t0 = time.monotonic()
    i = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, t0 + i / rate - time.monotonic()))
            break
        except TimeoutError:
            pass
        old, new = recycler.step()
        driver.spawn(driver.delete(old))
        driver.spawn(driver.create(new))
        i += 1
    await driver.drain()


async def wait_polled(
    cond: Callable[[], bool],
    within: float,
    progress: Callable[[], None] | None = None,
    every: float = 0.5,
    tell: float = 30.0,
) -> bool:
    """True once `cond` holds, checked every `every` s; False after `within`
    s. Not on every watch event, as load.wait_until: a check that walks
    20000 pods, once per event of theirs, would take the benchmark's process
    (on the measured cores) O(pods x events). The pods' times are the
    watch's stamps, so the polling delays none."""
    start = time.monotonic()
    told = start
    while not cond():
        now = time.monotonic()
        if now - start >= within:
            return False
        if progress is not None and now - told >= tell:
            progress()
            told = now
        await asyncio.sleep(every)
    return True


# -- the figures (pure) --------------------------------------------------------


def latencies(pods: Iterable[load.PodTimes], of: Callable[[load.PodTimes], float | None]) -> Any:
    return report.summary([x for p in pods if (x := of(p)) is not None], (50, 99))


def watch_totals(tallies: Iterable[tuple[watchcount.WatchSpec, watchcount.Tally]]) -> Any:
    """component -> events and bytes in the window, in total and by kind."""
    return watchcount.per_pod(tallies, 1)


def window_figures(
    spent: Mapping[str, Any], pods: list[load.PodTimes], watch: Mapping[str, Any]
) -> dict[str, Any]:
    """One window's figures from its CpuWindow reading, its churn pods and
    its watch totals."""
    cpu = spent["cpu_seconds"]
    n = max(1, sum(1 for p in pods if p.created is not None))
    window = spent["window_s"]
    return {
        "churn_pods": len(pods),
        "window_s": round(window, 2),
        "machine": spent["machine"],
        "cpu_seconds": dict(cpu),
        "cpu_ms_per_vnpu_pod": {
            "operator": 1000 * cpu.get("vnpu-operator", 0.0) / n,
            "agents": 1000 * report.agents_total(cpu) / n,
            "kube-apiserver": 1000 * cpu.get("kube-apiserver", 0.0) / n,
        },
        "apiserver_cpu_s": cpu.get("kube-apiserver", 0.0),
        "apiserver_cores": cpu.get("kube-apiserver", 0.0) / window if window > 0 else None,
        "ungate": latencies(pods, load.PodTimes.ungate_latency),
        "running": latencies(pods, load.PodTimes.running_latency),
        "gone": latencies(pods, load.PodTimes.gone_latency),
        "watch": dict(watch),
    }


def per_ordinary_event(
    a: Mapping[str, float], b: Mapping[str, float], events: int
) -> dict[str, float | None]:
    """CPU ms per ordinary-pod event of each process: what window B (with
    the ordinary churn) cost over window A (without), over the ordinary
    events B received over A (a watch of their namespace counts them)."""

    def per(key: Callable[[Mapping[str, float]], float]) -> float | None:
        return 1000 * (key(b) - key(a)) / events if events > 0 else None

    return {
        "operator": per(lambda c: c.get("vnpu-operator", 0.0)),
        "agents": per(report.agents_total),
        "kube-apiserver": per(lambda c: c.get("kube-apiserver", 0.0)),
        "all_processes": per(lambda c: sum(c.values())),
    }


def ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


def final_counts(
    allocs: list[dict[str, Any]],
    sims: Mapping[str, SimState],
    nodes: list[str],
    live_uids: set[str],
) -> dict[str, int]:
    """The snapshot's final counts with the live pods still there: every
    allocation but those of a live pod is left over."""
    out = snapshot.tally(allocs, sims, nodes, final=True)
    ours = set(nodes)
    out["leftover_allocations"] = sum(
        1
        for a in allocs
        if (a.get("spec") or {}).get("nodeName") in ours
        and (a.get("spec") or {}).get("podUID") not in live_uids
    )
    return out


def election() -> dict[str, float]:
    """The product's leader election settings, which the failover runs with."""
    f = OperatorSettings.model_fields
    return {
        "lease_s": float(f["leader_election_lease_seconds"].default),
        "renew_deadline_s": float(f["leader_election_renew_deadline_seconds"].default),
        "retry_s": float(f["leader_election_retry_seconds"].default),
    }


# -- the table -----------------------------------------------------------------


def _s(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}s"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.2f} ms"


def _mb(v: Any) -> str:
    return "-" if v is None else f"{v:.1f} MB"


def _pcts(s: Mapping[str, Any] | None) -> str:
    s = s or {}
    return f"{_s(s.get('p50'))} / {_s(s.get('p99'))}"


def watched(window: Mapping[str, Any], component: str, kind: str = "") -> dict[str, float]:
    """A window's watch events and bytes of `component` (of one `kind` of its watches)."""
    got = (window.get("watch") or {}).get(component) or {}
    if kind:
        got = (got.get("by_kind") or {}).get(kind) or {}
    return {"events": float(got.get("events", 0)), "bytes": float(got.get("bytes", 0))}


def table(r: Mapping[str, Any]) -> list[str]:
    """The printed report, one line each."""
    c = r["config"]
    lines = [
        f"=== vnpu-operator shared cluster: {c['nodes']} vNPU nodes x 8 chips "
        f"({c['agents']} agent process(es)), {c['ordinary_nodes']} ordinary node(s)",
    ]

    def row(label: str, *cells: str) -> None:
        lines.append((f"  {label:<50}" + "".join(f"{x:<24}" for x in cells)).rstrip())

    def head(title: str) -> None:
        lines.append(f"-- {title}")

    fill, ordi = r.get("fill") or {}, r.get("ordinary") or {}
    row("live vNPU pods / ordinary pods", f"{c['live']} / {c['ordinary']}")
    row("fill: vNPU pods placed, pods/s",
        f"{fill.get('placed')} in {fill.get('seconds', 0):.1f}s, "
        f"{report.fmt(fill.get('pods_per_s'), '/s')}")  # fmt: skip
    row("  created -> ungated p50 / p99", _pcts(fill.get("ungate")))
    row("ordinary pods Running, pods/s",
        f"{ordi.get('running')} in {ordi.get('seconds', 0):.1f}s, "
        f"{report.fmt(ordi.get('pods_per_s'), '/s')}")  # fmt: skip
    row("  created -> Running p50 / p99", _pcts(ordi.get("running_latency")))
    rss = r.get("operator_rss_mb") or {}
    row("operator RSS: synced / +live / +ordinary pods",
        f"{_mb(rss.get('synced'))} / {_mb(rss.get('after_fill'))} / "
        f"{_mb(rss.get('after_ordinary'))}")  # fmt: skip
    w = r.get("windows") or {}
    a, b = w.get("a") or {}, w.get("b") or {}
    head(f"churn windows: {c['churn_pods']} vNPU pods at {c['rate']:g}/s, held {c['hold']:g}s")
    row("", "A: vNPU churn alone", f"B: + ordinary {c['ordinary_rate']:g}/s")
    row("window (s)", *(report.fmt(x.get("window_s"), "") for x in (a, b)))
    row("vNPU created -> ungated p50 / p99", _pcts(a.get("ungate")), _pcts(b.get("ungate")))
    row("vNPU created -> Running p50 / p99", _pcts(a.get("running")), _pcts(b.get("running")))
    row("vNPU deleted -> gone p50 / p99", _pcts(a.get("gone")), _pcts(b.get("gone")))
    ob = b.get("ordinary") or {}
    row("floor: plain created -> Running p50 / p99", "-", _pcts(ob.get("running")))
    row("  vNPU / plain Running p99", "-", report.fmt(b.get("running_p99_over_plain"), "x"))
    for key, label in (("operator", "operator"), ("agents", "agents"),
                       ("kube-apiserver", "kube-apiserver")):  # fmt: skip
        row(f"{label} CPU per vNPU pod",
            _ms((a.get("cpu_ms_per_vnpu_pod") or {}).get(key)),
            _ms((b.get("cpu_ms_per_vnpu_pod") or {}).get(key)))  # fmt: skip
    row("kube-apiserver CPU s (cores busy)",
        *(f"{x.get('apiserver_cpu_s', 0):.1f}s ({report.fmt(x.get('apiserver_cores'), '')})"
          for x in (a, b)))  # fmt: skip
    row("cores busy (machine)",
        *(f"{100 * (x.get('machine') or {}).get('busy', 0):.0f}%" for x in (a, b)))  # fmt: skip
    for comp in ("operator", "agent"):
        row(f"{comp} watch events / MB",
            *(f"{watched(x, comp)['events']:.0f} / {watched(x, comp)['bytes'] / 1e6:.2f}"
              for x in (a, b)))  # fmt: skip
    row("  of which the operator's pod watch",
        *(f"{watched(x, 'operator', 'pods')['events']:.0f} / "
          f"{watched(x, 'operator', 'pods')['bytes'] / 1e6:.2f}" for x in (a, b)))  # fmt: skip
    row("ordinary pods replaced", "-", str(ob.get("replaced", 0)))
    row("ordinary pod events (watch of their namespace)",
        *(str(x.get("ordinary_events", "-")) for x in (a, b)))  # fmt: skip
    pe = r.get("per_ordinary_event") or {}
    head("CPU per ordinary-pod event: (B - A) CPU / (B - A) ordinary events")
    for key in ("operator", "agents", "kube-apiserver", "all_processes"):
        row(f"  {key}", _ms(pe.get(key)))
    head("peak RSS (VmHWM) after the windows")
    procs = r.get("processes") or {}
    for name, p in procs.items():
        row(f"  {name}", f"{_mb(p.get('peak_rss_mb'))} (now {_mb(p.get('rss_mb'))})")
    cs = r.get("cold_start") or {}
    head(f"cold start at {c['live']} live vNPU pods (SIGTERM, start again)")
    row("  SIGTERM -> exited", _s(cs.get("stop_s")))
    row("  process start -> ready (/readyz 200)", _s(cs.get("start_to_ready_s")))
    row("  ready -> a new pod placed / start -> placed",
        f"{_s(cs.get('ready_to_placed_s'))} / {_s(cs.get('start_to_placed_s'))}")  # fmt: skip
    row("  RSS at ready / after the placement",
        f"{_mb(cs.get('rss_ready_mb'))} / {_mb(cs.get('rss_placed_mb'))}")  # fmt: skip
    fo = r.get("failover") or {}
    el = fo.get("election") or {}
    head(f"failover: 2 replicas (lease {el.get('lease_s', 0):g}s), the leader SIGKILLed")
    row("  replicas started, a leader", _s(fo.get("replicas_start_s")))
    row("  kill -> takeover (Lease acquireTime)", _s(fo.get("kill_to_takeover_s")))
    row("  kill -> next new pod ungated", _s(fo.get("kill_to_next_placement_s")))
    row("  creates refused / tried", f"{fo.get('refused', '-')} / {fo.get('attempts', '-')}")
    head("correctness (all must be 0)")
    for k, v in (r.get("correctness") or {}).items():
        row(f"  {k}", str(v))
    if "runtime_s" in r:
        row("runtime", f"{r['runtime_s']:.0f}s")
    return lines


# -- the run -------------------------------------------------------------------


def start(args: argparse.Namespace, cluster: Cluster, out: dict[str, Any]) -> None:
    """The plane, both kinds of nodes, the agents and the operator."""
    plane = cluster.plane
    out["correctness"] = {}
    cluster.start_plane(say)
    for ns in (ORDINARY_NS, FAILOVER_NS):
        plane.kubectl("create", "namespace", ns)
    ordinary = ordinary_node_names(args.ordinary_nodes)
    say(f"creating {args.nodes} vNPU nodes and {len(ordinary)} ordinary nodes (kwok)")
    t = time.monotonic()
    cluster.add_nodes(cluster.nodes)
    cluster.add_nodes(ordinary, chips={}, labels={POOL_LABEL: POOL_ORDINARY})
    out["startup"] = {"nodes_ready_s": time.monotonic() - t}
    say(f"starting {cluster.agent_count} agent process(es), then the operator")
    t = time.monotonic()
    cluster.start_agents()
    out["startup"]["agents_to_all_vnpunodes_s"] = time.monotonic() - t
    t = time.monotonic()
    cluster.start_operator()
    out["startup"]["operator_ready_s"] = time.monotonic() - t
    assert cluster.operator is not None
    out["operator_rss_mb"] = {"synced": stats(cluster.operator).rss_mb}


@dataclass
class Shared:
    """What the phases share: the options, the plane, one API client, the
    trackers and drivers of both kinds of pods."""

    args: argparse.Namespace
    cluster: Cluster
    out: dict[str, Any]
    api: client.ApiClient
    core: client.CoreV1Api
    tracker: load.Tracker
    driver: load.Driver
    otracker: CountingTracker
    odriver: OrdinaryDriver
    live: list[load.PodTimes] = field(default_factory=list)
    ordinary: deque[load.PodTimes] = field(default_factory=deque)

    def count(self, counters: Mapping[str, int], prefix: str = "") -> None:
        for k, v in counters.items():
            self.out["correctness"][f"{prefix}{k}"] = (
                self.out["correctness"].get(f"{prefix}{k}", 0) + v
            )


async def phases(args: argparse.Namespace, cluster: Cluster, out: dict[str, Any]) -> None:
    api = await load.api_client(cluster.plane.kubeconfig, load.BENCH_UA, 2 * args.concurrency)
    core = client.CoreV1Api(api)
    tracker = load.Tracker(core, VNPU_NS, names.SCHEDULING_GATE)
    otracker = CountingTracker(core, ORDINARY_NS, "none")
    for t in (tracker, otracker):
        t.start()
        await t.synced.wait()
    # Each kind its own in-flight limit: the ordinary pods' calls do not
    # queue the vNPU pods' in the benchmark's client.
    driver = load.Driver(core, VNPU_NS, tracker, asyncio.Semaphore(args.concurrency))
    odriver = OrdinaryDriver(core, ORDINARY_NS, otracker, asyncio.Semaphore(args.concurrency))
    run = Shared(args, cluster, out, api, core, tracker, driver, otracker, odriver)
    try:
        await fill_phase(run)
        await ordinary_phase(run)
        for name in WINDOWS:
            out.setdefault("windows", {})[name] = await window_phase(run, name)
        a, b = out["windows"]["a"], out["windows"]["b"]
        out["per_ordinary_event"] = per_ordinary_event(
            a["cpu_seconds"], b["cpu_seconds"], b["ordinary_events"] - a["ordinary_events"]
        )
        out["processes"] = process_stats(cluster)
        await cold_start_phase(run)
        await failover_phase(run)
        await final_snapshot(run)
    finally:
        await tracker.stop()
        await otracker.stop()
        await api.close()


async def fill_phase(run: Shared) -> None:
    """`--live` vNPU pods as fast as the client allows, until all are ungated."""
    args, cluster = run.args, run.cluster
    run.live = load.mix_pods("live", args.live, seed=11)
    say(f"fill: {args.live} vNPU pods of the churn's mix, {args.concurrency} in flight")
    cpu = CpuWindow(cluster)
    cpu.start()
    t0 = await load.burst_create(run.driver, run.live)
    created = [p for p in run.live if p.created is not None]

    def placed() -> int:
        return sum(1 for p in created if p.ungated is not None)

    await wait_polled(
        lambda: placed() >= len(created), args.timeout,
        lambda: say(f"fill: {placed()} of {len(created)} placed"),
    )  # fmt: skip
    spent = cpu.stop()
    last = max((p.ungated for p in created if p.ungated is not None), default=t0)
    assert cluster.operator is not None
    run.out["operator_rss_mb"]["after_fill"] = stats(cluster.operator).rss_mb
    run.out["fill"] = {
        "pods": len(run.live),
        "created": len(created),
        "placed": placed(),
        "seconds": round(last - t0, 2),
        "pods_per_s": placed() / (last - t0) if last > t0 else None,
        "ungate": latencies(created, load.PodTimes.ungate_latency),
        "cpu_seconds": spent["cpu_seconds"],
        "machine": spent["machine"],
        "errors": run.driver.errors[:20],
    }
    run.out["correctness"]["live_pods_not_placed"] = len(created) - placed()
    say(f"fill: {placed()} placed in {last - t0:.1f}s")


async def ordinary_phase(run: Shared) -> None:
    """`--ordinary` plain pods as fast as the client allows, until Running."""
    args, cluster = run.args, run.cluster
    pods = [load.PodTimes(f"o-{i:06d}", "", 0) for i in range(args.ordinary)]
    say(f"ordinary: {args.ordinary} plain pods on {args.ordinary_nodes} nodes")
    cpu = CpuWindow(cluster)
    cpu.start()
    t0 = await load.burst_create(run.odriver, pods)
    created = [p for p in pods if p.created is not None]

    def running() -> int:
        return sum(1 for p in created if p.running is not None)

    await wait_polled(
        lambda: running() >= len(created), args.timeout,
        lambda: say(f"ordinary: {running()} of {len(created)} Running"),
    )  # fmt: skip
    spent = cpu.stop()
    last = max((p.running for p in created if p.running is not None), default=t0)
    assert cluster.operator is not None
    run.out["operator_rss_mb"]["after_ordinary"] = stats(cluster.operator).rss_mb
    run.ordinary = deque(created)
    run.out["ordinary"] = {
        "pods": len(pods),
        "created": len(created),
        "running": running(),
        "seconds": round(last - t0, 2),
        "pods_per_s": running() / (last - t0) if last > t0 else None,
        "running_latency": latencies(created, load.PodTimes.running_latency),
        "events": dict(run.otracker.events),
        "cpu_seconds": spent["cpu_seconds"],
        "machine": spent["machine"],
        "errors": run.odriver.errors[:20],
    }
    say(f"ordinary: {running()} Running in {last - t0:.1f}s")


async def mid_snapshot(run: Shared) -> dict[str, int]:
    """Near the churn's peak, aside at the lowest priority (bench/snapshot.py)."""
    args = run.args
    await asyncio.sleep(min(args.hold, args.churn_pods / args.rate) + 1)
    return await snapshot.aside(run.cluster.snapshot_spec(final=False))


async def window_phase(run: Shared, name: str) -> dict[str, Any]:
    """The vNPU churn; in window B with the ordinary churn beside it."""
    args, cluster = run.args, run.cluster
    ordinary = name == "b"
    pods = load.mix_pods(f"c{name}", args.churn_pods, seed=7)
    specs = watchcount.component_watches(a.nodes for a in cluster.agents)
    counting = watchcount.Counting(run.api, specs)
    await counting.start()
    events0 = Counter(run.otracker.events)
    recycler = Recycler(run.ordinary, f"r{name}")
    stop = asyncio.Event()
    say(f"window {name.upper()}: {args.churn_pods} vNPU pods at {args.rate:g}/s, held "
        f"{args.hold:g}s" + (f", ordinary pods replaced at {args.ordinary_rate:g}/s"
                             if ordinary else ""))  # fmt: skip
    cpu = CpuWindow(cluster)
    cpu.start()
    snap = asyncio.create_task(mid_snapshot(run))
    side = (
        asyncio.create_task(ordinary_churn(run.odriver, recycler, args.ordinary_rate, stop))
        if ordinary
        else None
    )
    await load.churn(run.driver, pods, args.rate, args.hold, args.timeout, say)
    stop.set()
    if side is not None:
        await side
    spent = cpu.stop()
    events = Counter(run.otracker.events)
    events.subtract(events0)
    await counting.stop()
    run.count(await snap, prefix=f"window_{name}_")
    out = window_figures(spent, pods, watch_totals(counting.tallies))
    # In A too: what the ordinary pods do with no churn of theirs (nothing, on kwok).
    out["ordinary_events"] = sum(v for v in events.values() if v > 0)
    out["errors"] = run.driver.errors[-20:]
    run.out["correctness"][f"window_{name}_pods_never_ungated"] = sum(
        1 for p in pods if p.created is not None and p.ungated is None
    )
    run.out["correctness"][f"window_{name}_pods_not_gone"] = sum(
        1 for p in pods if p.created is not None and p.gone is None
    )
    if ordinary:
        total = out["ordinary_events"]
        await wait_polled(
            lambda: (
                all(p.running for p in recycler.created if p.created)
                and all(p.gone for p in recycler.deleted if p.delete_called)
            ),
            args.timeout,
        )
        out["ordinary"] = {
            "replaced": len(recycler.created),
            "events": total,
            "events_by_type": {k: v for k, v in events.items() if v > 0},
            "events_per_replacement": ratio(total, len(recycler.created)),
            "running": latencies(recycler.created, load.PodTimes.running_latency),
            "gone": latencies(recycler.deleted, load.PodTimes.gone_latency),
            "not_running": sum(1 for p in recycler.created if p.created and not p.running),
            "errors": run.odriver.errors[-20:],
        }
        out["running_p99_over_plain"] = ratio(
            out["running"].get("p99"), out["ordinary"]["running"].get("p99")
        )
    say(f"window {name.upper()}: ungate p99 {_s(out['ungate'].get('p99'))}, operator "
        f"{_ms(out['cpu_ms_per_vnpu_pod']['operator'])} per vNPU pod")  # fmt: skip
    return out


def process_stats(cluster: Cluster) -> dict[str, Any]:
    """Peak (VmHWM) and current RSS of the operator and of each agent."""
    procs: list[tuple[str, ServiceProcess]] = []
    if cluster.operator is not None:
        procs.append(("vnpu-operator", cluster.operator))
    procs += [(f"vnpu-agent-{i}", a) for i, a in enumerate(cluster.agents)]
    out = {}
    for name, proc in procs:
        s = stats(proc)
        out[name] = {"peak_rss_mb": s.peak_rss_mb, "rss_mb": s.rss_mb, "cpu_s": s.cpu_seconds}
    return out


async def cold_start_phase(run: Shared) -> None:
    """The operator stopped and started again with every live allocation
    there: start -> ready -> a new pod placed."""
    args, cluster, out = run.args, run.cluster, run.out
    op = cluster.operator
    assert op is not None
    say(f"cold start: SIGTERM to the operator, start it again ({args.live} live vNPU pods)")
    cs: dict[str, Any] = {}
    t = time.monotonic()
    try:
        await asyncio.to_thread(op.kill, signal.SIGTERM)
    except AssertionError as exc:  # a hung or failed shutdown: the run goes on
        cs["stop_error"] = str(exc)[:2000]
        out["correctness"]["cold_start_sigterm_not_clean"] = 1
    cs["stop_s"] = time.monotonic() - t
    t0 = time.monotonic()
    await asyncio.to_thread(op.start, ready_timeout=0)
    await asyncio.to_thread(wait_for, "operator ready", op.ready, args.timeout, 0.05)
    ready = time.monotonic()
    cs["start_to_ready_s"] = ready - t0
    cs["rss_ready_mb"] = stats(op).rss_mb
    probe = load.PodTimes("cold-0000", PROBE_TEMPLATE, 1)
    cs["probe_refused"] = await create_until_admitted(run.driver, probe, PROBE_RETRY_S)
    if probe.created is not None:
        await load.wait_until(run.tracker, lambda: probe.ungated is not None, args.timeout)
    if probe.ungated is not None:
        cs["ready_to_placed_s"] = probe.ungated - ready
        cs["start_to_placed_s"] = probe.ungated - t0
    else:
        out["correctness"]["cold_start_probe_not_placed"] = 1
    cs["rss_placed_mb"] = stats(op).rss_mb
    if probe.created is not None:
        await run.driver.delete(probe)
        await load.wait_until(run.tracker, lambda: probe.gone is not None, args.timeout)
        out["correctness"]["cold_start_probe_not_gone"] = 0 if probe.gone else 1
    out["cold_start"] = cs
    say(f"cold start: ready in {_s(cs['start_to_ready_s'])}, placed "
        f"{_s(cs.get('start_to_placed_s'))} after the start")  # fmt: skip


async def create_until_admitted(driver: load.Driver, pod: load.PodTimes, within: float) -> int:
    """Creates `pod`, again every 0.2 s while the API server refuses it (the
    webhook of a process just ready may not be registered yet), at most
    `within` s; how many creates were refused (their errors are dropped)."""
    refused = 0
    deadline = time.monotonic() + within
    while True:
        errors = len(driver.errors)
        await driver.create(pod)
        if pod.created is not None:
            return refused
        refused += 1
        if time.monotonic() > deadline:
            return refused
        del driver.errors[errors:]
        await asyncio.sleep(0.2)


async def failover_phase(run: Shared) -> None:
    """Two replicas, the leader SIGKILLed while pods are created at
    `--failover-rate`: kill -> the next new pod ungated."""
    args, cluster, out = run.args, run.cluster, run.out
    plane = cluster.plane
    await asyncio.to_thread(cluster.stop_operator)
    cluster.operator = None
    el = election()
    say("failover: two replicas behind a webhook proxy")
    replicas = failover.Replicas(
        plane, cluster.workdir / "replicas", 2, OPERATOR_SETTINGS, ready_timeout=args.timeout
    )
    fo: dict[str, Any] = {"election": el}
    try:
        t = time.monotonic()
        await asyncio.to_thread(replicas.start)
        fo["replicas_start_s"] = time.monotonic() - t
        killed: dict[str, Any] = {}

        def kill() -> float:
            leader = replicas.wait_leader()
            killed.update(op=leader, wall=time.time())
            at = time.monotonic()
            leader.kill(signal.SIGKILL)
            return at

        window = await failover.restart_window(
            plane, FAILOVER_NS, "fo", kill, rate=args.failover_rate, before=5,
            after=el["lease_s"] + 10,
        )  # fmt: skip
        fo.update(window)
        fo["kill_to_takeover_s"] = await asyncio.to_thread(takeover, replicas, killed)
        await asyncio.to_thread(failover.delete_all, plane, FAILOVER_NS)
    finally:
        await asyncio.to_thread(replicas.stop)
    out["failover"] = fo
    if fo.get("kill_to_next_placement_s") is None:
        out["correctness"]["failover_no_placement_after_kill"] = 1
    say(f"failover: next placement {_s(fo.get('kill_to_next_placement_s'))} after the kill, "
        f"{fo.get('refused')} of {fo.get('attempts')} creates refused")  # fmt: skip


def takeover(replicas: failover.Replicas, killed: Mapping[str, Any]) -> float | None:
    """Seconds from the kill to the new leader's Lease acquireTime."""
    if "op" not in killed:
        return None
    try:
        replicas.wait_leader(other_than=killed["op"], timeout=60)
    except AssertionError:
        return None
    acquired = parse_time((replicas.lease().get("spec") or {}).get("acquireTime"))
    return None if acquired is None else acquired - float(killed["wall"])


async def final_snapshot(run: Shared) -> None:
    """Double booking, over-commitment, leaks, with the live pods there."""
    spec = run.cluster.snapshot_spec(final=True)
    say("correctness snapshot")

    def take() -> dict[str, int]:
        allocs = snapshot.list_allocations(spec.kubectl)
        return final_counts(
            allocs, snapshot.read_simulators(spec), spec.nodes, {p.uid for p in run.live if p.uid}
        )

    run.count(await asyncio.to_thread(take), prefix="final_")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = on_plane(args, args.agents, start, phases)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str))
    print()
    print("\n".join(table(out)))
    if args.keep:
        print(f"kept: {args.workdir}")
    return report.failed(out["correctness"])


if __name__ == "__main__":
    raise SystemExit(main())
