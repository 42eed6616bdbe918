"""`python -m bench`: the scale benchmark on a local control plane.

Phases (one plane, one run): kwok nodes with simulated chips, agent(s) in
many-nodes mode, the operator; (1) churn: pods with vNPU annotations created
at a steady rate, held, deleted; (2) fill: pods that fill the 910B3 chips
created as fast as the client allows (throughput), some wait, capacity is
freed and the waiting pods' placement is timed; (3) idle: our writes/s;
then the operator is stopped and the floor (bench/load.py FloorWriter)
repeats the churn and the burst doing the same writes per pod with no logic.
With --floors (on by default, off in --quick; bench/floors.py): a churn with
Kopf's floor (empty handlers) beside the operator, counting each component's
watch events and bytes, and a baseline churn of plain pods once the operator
is stopped. With --rate-search: the sustainable rate of ours and of baseline.
With --attribution (on by default): each churn pod's steps and the one that
held the slowest 1% (bench/steps.py), and the periodic work that overlapped
them (bench/timeline.py; the components log their pauses, --pauses-ms).
The idle window starts once every VNPUNode write the agents' settle interval
put off is due. `python -m bench.scale`: the churn at several node counts.
Exits 1 if a correctness counter is not 0 (no timing assertions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench import apiprofile, floors, load, release, report, snapshot, stacks, steps, timeline
from bench.allocclock import AllocationClock, reuse_delays
from bench.cluster import (
    Cluster,
    MachineCpu,
    ProcStats,
    agent_setting,
    machine_cpu,
    proc_stats,
    stats,
    worker_threads_cpu,
)
from bench.rates import Search
from vnpu_common.process import pauses
from vnpu_common.wire import names


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def settle_audit(path: Path, quiet: float = 2.0, limit: float = 60) -> int:
    """The audit log's size once it has had no write but Lease renewals for
    `quiet` seconds: renewals are spread evenly over time and never stop."""
    start = time.monotonic()
    offset = path.stat().st_size
    last_write = start
    while time.monotonic() - last_write < quiet and time.monotonic() - start < limit:
        time.sleep(0.25)
        size = path.stat().st_size
        events = report.audit_events(path, offset, size)
        offset = size
        if any(not report.what(e).endswith(" leases") for e in events):
            last_write = time.monotonic()
    return offset


def cpu_by_process(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of every process on the machine's two cores that
    the benchmark started, this one included: who the churn's CPU went to."""
    pids = {name: p.pid for name, p in cluster.plane.procs.items()}
    pids.update(our_pids(cluster))
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = proc_stats(pid).cpu_seconds
        except OSError:
            continue
    t = os.times()
    out["bench-driver"] = t.user + t.system
    return out


def our_pids(cluster: Cluster) -> dict[str, int]:
    """The operator's and the agents' processes by the name the report gives them."""
    pids = agent_pids(cluster)
    if cluster.operator and cluster.operator.proc:
        pids["vnpu-operator"] = cluster.operator.proc.pid
    return pids


def sampled_pids(pids: dict[str, int], which: str) -> dict[str, int]:
    """Of our processes, those `--pyspy` samples: on 2 cores, py-spy on eight
    agents at 200 samples/s took most of a core and the run was no longer
    the one measured, so `--pyspy operator` samples the operator alone."""
    if which == "operator":
        return {k: v for k, v in pids.items() if k == "vnpu-operator"}
    return dict(pids)


def agent_pids(cluster: Cluster) -> dict[str, int]:
    """The running agent processes by the name the report gives them."""
    return {
        f"{report.AGENT_PROCESS}-{i}": agent.proc.pid
        for i, agent in enumerate(cluster.agents)
        if agent.proc
    }


def driver_cpu(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of each agent process's driver calls (its worker
    threads): the simulated chips' share of the agent's CPU."""
    out = {}
    for name, pid in agent_pids(cluster).items():
        try:
            out[name] = worker_threads_cpu(pid)
        except OSError:
            continue
    return out


class CpuWindow:
    """CPU seconds each benchmark-started process spent from `start()` until
    `stop()`, the window's length, and the whole machine's time over it
    (`machine_share`): what a phase cost, whom, and on how fast a machine."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._start: dict[str, float] = {}
        self._t0 = 0.0
        self._machine = MachineCpu(0.0, 0.0, 0.0)

    def start(self) -> None:
        self._start, self._t0 = cpu_by_process(self._cluster), time.monotonic()
        self._machine = machine_cpu()

    def stop(self) -> dict[str, Any]:
        end, window = cpu_by_process(self._cluster), time.monotonic() - self._t0
        spent = {k: round(v - self._start.get(k, 0.0), 2) for k, v in end.items()}
        return {
            "window_s": window,
            "cpu_seconds": spent,
            "machine": machine_share(self._machine, machine_cpu()),
        }


def machine_share(before: MachineCpu, after: MachineCpu) -> dict[str, float]:
    """Shares of the machine's time between two readings: busy, idle and
    stolen by the hypervisor."""
    busy, idle = after.busy - before.busy, after.idle - before.idle
    steal = after.steal - before.steal
    total = max(busy + idle + steal, 1e-9)
    return {"busy": busy / total, "idle": idle / total, "steal": steal / total}


def ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


@dataclass
class Run:
    """What every phase shares: the options, the plane, the results being
    written, one API client and the benchmark's pod tracker and driver."""

    args: argparse.Namespace
    cluster: Cluster
    out: dict[str, Any]
    api: client.ApiClient
    core: client.CoreV1Api
    limit: asyncio.Semaphore
    tracker: load.Tracker
    driver: load.Driver
    # The allocations of the pods in "bench", watched until the operator stops.
    clock: AllocationClock
    # The benchmark's own pause lines (its watches time every step).
    own_pauses: timeline.PauseLog = field(default_factory=timeline.PauseLog)
    correctness: Counter[str] = field(default_factory=Counter)
    # Where the audit log stood when the last phase before the idle window began.
    audit_mark: int = 0

    def cpu(self) -> dict[str, float]:
        return cpu_by_process(self.cluster)

    def count(self, counters: dict[str, int], prefix: str = "") -> None:
        for k, v in counters.items():
            self.correctness[f"{prefix}{k}"] += v


@dataclass
class Churned:
    """What the later phases need of the churn."""

    pods: int
    cpu_window_s: float
    operator_before: ProcStats | None
    audit_start: int = 0


@dataclass
class Filled:
    """What the later phases need of the fill's burst."""

    placed: int
    pods_per_s: float | None
    burst_cpu: dict[str, Any]


async def phases(args: argparse.Namespace, cluster: Cluster, out: dict[str, Any]) -> None:
    api = await load.api_client(cluster.plane.kubeconfig, load.BENCH_UA, args.concurrency)
    core = client.CoreV1Api(api)
    limit = asyncio.Semaphore(args.concurrency)
    tracker = load.Tracker(core, "bench", names.SCHEDULING_GATE)
    tracker.start()
    await tracker.synced.wait()
    driver = load.Driver(core, "bench", tracker, limit)
    clock = AllocationClock(client.CustomObjectsApi(api), "bench")
    clock.start()
    await clock.synced.wait()
    run = Run(args, cluster, out, api, core, limit, tracker, driver, clock)
    watcher = None
    if args.pauses_ms:
        logging.getLogger(pauses.__name__).addHandler(run.own_pauses)
        logging.getLogger(pauses.__name__).setLevel(logging.INFO)
        watcher = asyncio.create_task(pauses.watch(args.pauses_ms))
    try:
        churned = await churn_phase(run)
        if args.scale_only:
            run.audit_mark = churned.audit_start
            await idle_phase(run, churned)
            process_phase(run, churned)
            await clock.stop()
            await tracker.stop()
        else:
            filled = await fill_phase(run)
            await idle_phase(run, churned)
            process_phase(run, churned)
            await ours_again_phase(run)
            await floor_phase(run, filled)
            await baseline_phase(run)
    finally:
        if watcher is not None:
            watcher.cancel()
            logging.getLogger(pauses.__name__).removeHandler(run.own_pauses)
    out["correctness"] = dict(run.correctness)
    await api.close()


async def churn_phase(run: Run) -> Churned:
    """Pods of mixed templates created at `--rate`, held, deleted: latencies,
    CPU per pod, writes and requests per pod (optionally py-spy's stacks)."""
    args, cluster, out, core, driver = run.args, run.cluster, run.out, run.core, run.driver
    plane = cluster.plane
    pods = load.mix_pods("c", args.pods)
    op0 = stats(cluster.operator) if cluster.operator else None
    off0 = settle_audit(plane.audit_log)
    req0 = report.apiserver_requests(plane)
    hooks0 = report.webhook_calls(plane)
    say(f"churn: {args.pods} pods at {args.rate}/s, held {args.hold}s")
    sampler = (
        stacks.Sampler(sampled_pids(our_pids(cluster), args.pyspy), cluster.workdir)
        if args.pyspy
        else None
    )
    if sampler:
        sampler.start()
    churn_cpu = CpuWindow(cluster)
    churn_cpu.start()
    drv_start = driver_cpu(cluster)
    snap_task = asyncio.create_task(_mid_snapshot(cluster, args))
    profiler = start_profile(cluster, args, "churn")
    churn_s = await load.churn(driver, pods, args.rate, args.hold, args.timeout, say)
    mid = await snap_task
    spent = churn_cpu.stop()
    if profiler:
        # After the CPU window: the reading (go tool pprof) and the wait for
        # the last slice would lengthen it, and the idle rate taken out per
        # second of it would shrink the CPU per pod.
        out["churn_apiserver_cpu"] = await read_profile(cluster, profiler)
    cpu_window = spent["window_s"]
    drv_end = driver_cpu(cluster)
    if sampler:
        sampled = await asyncio.to_thread(sampler.stop)
        out["stacks"] = {k: v.to_json() for k, v in sampled.items()}
    off1 = settle_audit(plane.audit_log)
    req1 = report.apiserver_requests(plane)
    hooks1 = report.webhook_calls(plane)
    run.count(mid)
    # Capacity is never short in the churn (a few pods per node), so a pod
    # still gated `stuck_seconds` after creation (or deleted gated) is stuck.
    never = [
        p for p in pods
        if p.created is not None
        and (p.ungated or p.delete_called or time.monotonic()) - p.created > args.stuck_seconds
        and (p.ungated is None or p.ungated - p.created > args.stuck_seconds)
    ]  # fmt: skip
    run.correctness["churn_pods_stuck_gated"] = len(never)
    run.correctness["churn_pods_not_gone"] = sum(1 for p in pods if p.created and p.gone is None)
    if args.attribution:
        out["attribution"] = attribution(run, pods, off0, off1)
    ung = [x for p in pods if (x := p.ungate_latency()) is not None]
    gone = [x for p in pods if (x := p.gone_latency()) is not None]
    out["churn"] = {
        "duration_s": churn_s,
        "ungate": report.summary(ung),
        "scheduled": report.summary([x for p in pods if (x := p.scheduled_latency()) is not None]),
        "running": report.summary([x for p in pods if (x := p.running_latency()) is not None]),
        "gone": report.summary(gone, (50, 90, 99)),
        "errors": driver.errors[:20],
        "our_events": await report.events_by_reason(core, "bench"),
        "cpu_seconds": spent["cpu_seconds"],
        "cpu_window_s": cpu_window,
        "machine": spent["machine"],
        "driver_cpu_seconds": {k: round(v - drv_start.get(k, 0), 2) for k, v in drv_end.items()},
        "webhook_calls_per_pod": {
            k: v / max(1, len(pods)) for k, v in sorted((hooks1 - hooks0).items())
        },
    }
    out["churn"]["cpu_ms_per_pod"] = {
        k: 1000 * v / max(1, len(pods)) for k, v in out["churn"]["cpu_seconds"].items()
    }
    say(f"churn done in {churn_s:.0f}s: ungate p99 {report.fmt(report.pct(ung, 99))}, "
        f"gone p99 {report.fmt(report.pct(gone, 99))}")  # fmt: skip
    events = report.audit_events(plane.audit_log, off0, off1)
    out["writes_per_lifecycle"] = report.per_lifecycle(events, "bench", len(pods))
    out["churn_writes_by_component"] = {k: dict(v) for k, v in report.tally(events).items()}
    out["churn_requests_all_clients"] = dict((req1 - req0).most_common())
    out["per_pod_requests_all_clients"] = {
        k: v / max(1, len(pods)) for k, v in (req1 - req0).most_common(25)
    }
    return Churned(len(pods), cpu_window, op0, off0)


def attribution(run: Run, pods: list[load.PodTimes], off0: int, off1: int) -> dict[str, Any]:
    """Where each churn pod's time went (bench/steps.py) and which periodic
    work overlapped the slowest (bench/timeline.py)."""
    cluster = run.cluster
    offset = time.time() - time.monotonic()
    events = report.audit_events(cluster.plane.audit_log, off0, off1, reads=True)
    logs = [("agents", a.log_path) for a in cluster.agents]
    if cluster.operator is not None:
        logs.append(("operator", cluster.operator.log_path))
    settle = agent_setting("inventory_settle_seconds")
    work = timeline.from_audit(events, offset, settle) + timeline.from_logs(logs, offset)
    work += timeline.from_pause_lines("bench", run.own_pauses.lines, offset)
    out = steps.attribution(pods, run.clock)
    for chain in out.values():
        windows = chain.pop("windows")
        chain["overlaps"] = timeline.overlaps(work, windows["all"], windows["slowest"])
    # Every stamp and every piece of work, for a look of one's own: written
    # to --timeline-out (main), not into the results.
    if run.args.timeline_out:
        run.out[TIMELINE_KEY] = steps.raw(pods, run.clock, work)
    return out


TIMELINE_KEY = "_timeline"


def write_results(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """The results as JSON at --out, the raw timeline at --timeline-out."""
    raw = out.pop(TIMELINE_KEY, None)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str))
    if raw is not None and args.timeline_out:
        args.timeline_out.write_text(json.dumps(raw, default=str))


def print_attribution(r: dict[str, Any]) -> None:
    att = r.get("attribution")
    if not att:
        return
    steps.print_attribution(att)
    for key in ("ungate", "gone"):
        if key in att:
            timeline.print_overlaps(att[key]["latency"], att[key]["overlaps"])


async def fill_phase(run: Run) -> Filled:
    """A burst to capacity as fast as the client allows (throughput), some
    pods left waiting; capacity freed and the waiting pods' placement timed."""
    args, cluster, driver, tracker = run.args, run.cluster, run.driver, run.tracker
    capacity = 2 * len(cluster.nodes)
    waiting_n = max(2, len(cluster.nodes) // 10)
    template, count = load.FILL
    fill = [load.PodTimes(f"f-{i:05d}", template, count) for i in range(capacity + waiting_n)]
    say(f"fill: {len(fill)} pods of {count} x {template} (capacity {capacity}) as fast as possible")
    clock = run.clock
    run.audit_mark = cluster.plane.audit_log.stat().st_size
    profiler = start_profile(cluster, args, "burst")
    burst_cpu = CpuWindow(cluster)
    burst_cpu.start()
    t0 = await load.burst_create(driver, fill)

    def placed_so_far() -> int:
        return sum(1 for p in fill if p.ungated)

    await load.wait_until(
        tracker,
        lambda: placed_so_far() >= capacity,
        args.timeout,
        progress=lambda: say(f"fill: {placed_so_far()} of {capacity} placed"),
    )
    ours_burst_cpu = burst_cpu.stop()
    if profiler:
        run.out["burst_apiserver_cpu"] = await read_profile(cluster, profiler)
    await asyncio.sleep(5)  # nothing else should be placed
    placed = [p for p in fill if p.ungated]
    waiting = [p for p in fill if not p.ungated and p.created]
    last = max((p.ungated for p in placed if p.ungated), default=t0)
    ours_tp = len(placed) / (last - t0) if last > t0 else None
    run.count(await asyncio.to_thread(snapshot.take, cluster.snapshot_spec(final=False)))
    run.correctness["fill_pods_stuck_gated"] = max(0, capacity - len(placed))
    freed = placed[: len(waiting)]
    audit = cluster.plane.audit_log
    release_mark = audit.stat().st_size
    sampler = (
        stacks.Sampler(sampled_pids(our_pids(cluster), args.pyspy), cluster.workdir, "release")
        if args.pyspy
        else None
    )
    if sampler:
        sampler.start()
    profiler = start_profile(cluster, args, "release")
    release_cpu = CpuWindow(cluster)
    release_cpu.start()
    # Paced (--release-rate), the release is timed at a rate the machine
    # sustains; all at once, a burst of 100 deletions at 1000 nodes
    # saturates 2 cores.
    t_free = await load.paced_delete(driver, freed, args.release_rate)
    await load.wait_until(tracker, lambda: all(p.ungated for p in waiting), args.timeout)
    # Whom the release's CPU went to: on 2 cores, a delay no process's own
    # work explains is the wait for a core.
    release_spent = release_cpu.stop()
    release_end = audit.stat().st_size
    if sampler:
        sampled = await asyncio.to_thread(sampler.stop)
        run.out["release_stacks"] = {k: v.to_json() for k, v in sampled.items()}
    if profiler:
        run.out["release_apiserver_cpu"] = await read_profile(cluster, profiler)
    # The k-th deletion paired with the k-th waiting pod ungated: when the
    # deletions are paced, time since the first would count the pacing.
    w2p = reuse_delays([p.delete_sent for p in freed], [p.ungated for p in waiting])
    run.correctness["waiting_pods_stuck_gated"] = sum(1 for p in waiting if not p.ungated)
    # From the freed pods' allocations gone (the capacity free) to the
    # waiting pods' allocations created (placed) and to the pods ungated.
    freed_at = [clock.all_gone(p.uid) for p in freed]
    taken_at = [clock.all_created(p.uid, count) for p in waiting]
    gone_to_placed = reuse_delays(freed_at, taken_at)
    events = report.audit_events(audit, release_mark, audit.stat().st_size)
    offset = time.time() - time.monotonic()
    sent = release.creates_sent(events, [p.name for p in waiting], offset)
    sent_at = [sent.get(p.name) for p in waiting]
    served_free, served_placed = release.committed(
        events, [p.name for p in freed], [p.name for p in waiting], count, offset
    )
    served_freed_at = [served_free.get(p.name) for p in freed]
    served_taken_at = [served_placed.get(p.name) for p in waiting]
    gone_to_ungated = reuse_delays(freed_at, [p.ungated for p in waiting])

    def since_free(times: list[float | None]) -> list[float]:
        return [round(t - t_free, 3) for t in sorted(x for x in times if x)]

    run.out["fill"] = {
        "created": len(fill), "placed": len(placed), "waiting": len(waiting),
        "freed": len(freed), "wait_to_place": report.summary(w2p, (50, 99)),
        "release_rate": args.release_rate or None,
        "release_window_s": round(release_spent["window_s"], 2),
        "release_cpu_seconds": release_spent["cpu_seconds"],
        # Every write the API server served in the release window: what its
        # CPU went to (a VNPUNode write costs five allocation writes).
        "release_writes": {
            k: dict(v)
            for k, v in report.tally(report.audit_events(audit, release_mark, release_end)).items()
        },
        "gone_to_placed": report.summary(gone_to_placed, (50, 99)),
        "gone_to_ungated": report.summary(gone_to_ungated, (50, 99)),
        **release.split(freed_at, sent_at, taken_at),
        # Both ends as the API server served them (bench/release.py): the
        # benchmark's watch, which stamps the two above, lags when busy.
        "served": {
            "gone_to_placed": report.summary(
                reuse_delays(served_freed_at, served_taken_at), (50, 99)),
            **release.split(served_freed_at, sent_at, served_taken_at),
        },
        # The release as it went, seconds after the deletions: the k-th
        # capacity freed (all of a freed pod's allocations gone) and the k-th
        # waiting pod placed (all of its allocations created), both sorted.
        "release_series": {
            "freed": since_free(freed_at),
            "creates_sent": since_free(sent_at),
            "placed": since_free(taken_at),
            "served_freed": since_free(served_freed_at),
            "served_placed": since_free(served_taken_at),
        },
        "ungate_latency_burst": report.summary(
            [x for p in placed if (x := p.ungate_latency()) is not None]),
    }  # fmt: skip
    say(
        f"fill: {len(placed)} placed in {last - t0:.1f}s ({report.fmt(ours_tp, '')}/s); "
        f"{len(waiting)} waited, ungated max {report.fmt(max(w2p, default=None))} after their "
        f"deletion, placed max {report.fmt(max(gone_to_placed, default=None))} after the "
        "allocations went"
    )
    if not await load.delete_all(driver, fill, args.timeout, say):
        run.correctness["fill_pods_not_gone"] = sum(1 for p in fill if p.created and not p.gone)
    return Filled(len(placed), ours_tp, ours_burst_cpu)


async def idle_phase(run: Run, churned: Churned) -> None:
    """Nothing left behind, then `--idle` seconds of our writes and CPU with
    no pod: what the churn's CPU per pod is taken net of."""
    args, cluster, out = run.args, run.cluster, run.out
    plane = cluster.plane
    await asyncio.sleep(8)  # past the agent's inventory coalescing interval
    settled = await settled_writes(run)
    run.count(await asyncio.to_thread(snapshot.take, cluster.snapshot_spec(final=True)))
    a = plane.audit_log.stat().st_size
    say(f"idle {args.idle}s")
    idle_cpu0, t_idle0 = cpu_by_process(cluster), time.monotonic()
    idle_drv0 = driver_cpu(cluster)
    await asyncio.sleep(args.idle)
    idle_cpu1, idle_s = cpu_by_process(cluster), time.monotonic() - t_idle0
    idle_drv1 = driver_cpu(cluster)
    idle_events = report.audit_events(plane.audit_log, a, plane.audit_log.stat().st_size)
    ours = [e for e in idle_events if report.component(e) in report.OURS.values()]
    kinds = Counter(report.what(e) for e in ours)
    out["idle"] = {
        "seconds": args.idle, "writes_per_s": len(ours) / args.idle,
        "non_lease_writes": sum(v for k, v in kinds.items() if not k.endswith(" leases")),
        "kinds": dict(kinds),
        # Before the window: the VNPUNode writes the settle interval put off.
        "settled_writes_before": settled,
        "cpu_per_s": {k: (v - idle_cpu0.get(k, 0)) / idle_s for k, v in idle_cpu1.items()},
        "driver_cpu_per_s": {k: (v - idle_drv0.get(k, 0)) / idle_s for k, v in idle_drv1.items()},
    }  # fmt: skip
    window, pods = churned.cpu_window_s, churned.pods
    out["churn"]["cpu_ms_per_pod_over_idle"] = over_idle(
        out["churn"]["cpu_seconds"], out["idle"]["cpu_per_s"], window, pods
    )
    out["churn"]["driver_ms_per_pod_over_idle"] = over_idle(
        out["churn"]["driver_cpu_seconds"], out["idle"]["driver_cpu_per_s"], window, pods
    )
    run.correctness["idle_non_lease_writes"] = out["idle"]["non_lease_writes"]


_WRITES = frozenset({"create", "update", "patch"})


def put_off_due(events: list[dict[str, Any]], settle: float, min_interval: float) -> float | None:
    """When (epoch s) the last VNPUNode write the agents' settle interval may
    have put off is due, from the audit events: `settle` after an agent's last
    VNPUNode write (what allocations add waits from there), and after its last
    release (the allocation's finalizer removed; the release waits from the
    agent's first look at it, at most `min_interval` after the destroy). None
    when the events show neither."""
    writes, releases = [], []
    for e in events:
        ref = e.get("objectRef") or {}
        at = timeline.epoch(e.get("stageTimestamp"))
        if report.component(e) != "agent" or at is None:
            continue
        if ref.get("resource") == names.NODE_PLURAL and e.get("verb") in _WRITES:
            writes.append(at + settle)
        elif (
            ref.get("resource") == names.ALLOCATION_PLURAL
            and not ref.get("subresource")
            and e.get("verb") == "patch"
        ):
            releases.append(at + min_interval + settle)
    return max(writes + releases, default=None)


async def settled_writes(run: Run) -> dict[str, Any]:
    """Waits until every VNPUNode write the agents' settle interval may have
    put off is due (put_off_due, from what the audit log shows since
    `run.audit_mark`), then until the audit log shows only Lease renewals:
    the idle window starts there, so what it counts is written idle. The
    writes of the wait, by kind, and how long it took."""
    plane = run.cluster.plane
    start = time.monotonic()
    a = await asyncio.to_thread(settle_audit, plane.audit_log)
    events = report.audit_events(plane.audit_log, run.audit_mark, a)
    settle = agent_setting("inventory_settle_seconds")
    last = put_off_due(events, settle, agent_setting("inventory_min_interval_seconds"))
    if last is not None:
        # The put-off write is armed when the last write starts: 2 s of slack.
        due = last + 2.0 - time.time()
        if due > 0:
            say(f"idle: waiting {due:.0f}s for the VNPUNode writes the settle interval put off")
            await asyncio.sleep(due)
    b = await asyncio.to_thread(settle_audit, plane.audit_log)
    ours = [
        e for e in report.audit_events(plane.audit_log, a, b)
        if report.component(e) in report.OURS.values() and not report.what(e).endswith(" leases")
    ]  # fmt: skip
    return {
        "writes": len(ours),
        "kinds": dict(Counter(report.what(e) for e in ours)),
        "settle_interval_s": settle,
        "waited_s": round(time.monotonic() - start, 1),
    }


def process_phase(run: Run, churned: Churned) -> None:
    """The operator's and the agents' CPU and RSS so far."""
    cluster = run.cluster
    op = stats(cluster.operator) if cluster.operator else ProcStats(0, 0, 0)
    agents = [stats(x) for x in cluster.agents]
    base = cluster.agent_base or ProcStats(0, 0, 0)
    op0 = churned.operator_before
    run.out["processes"] = {
        "operator": {"cpu_seconds": op.cpu_seconds - (op0.cpu_seconds if op0 else 0),
                     "cpu_seconds_total": op.cpu_seconds, "peak_rss_mb": op.peak_rss_mb,
                     "leader_step_downs": leader_step_downs(cluster)},
        "agents": {
            "cpu_seconds": sum(s.cpu_seconds for s in agents),
            "peak_rss_mb": sum(s.peak_rss_mb for s in agents),
            "base_rss_mb": base.peak_rss_mb,
            "mb_per_node_over_base": (sum(s.peak_rss_mb for s in agents)
                                      - len(agents) * base.peak_rss_mb) / len(cluster.nodes),
        },
    }  # fmt: skip


def leader_step_downs(cluster: Cluster) -> int:
    """How often the operator stopped leading so far (its log says so each
    time): under a load its API server answers renewals slowly, each one
    refuses its writes until it leads again."""
    if cluster.operator is None or not cluster.operator.log_path.exists():
        return 0
    text = cluster.operator.log_path.read_text(errors="replace")
    return text.count(" stopped leading (holder now ")


async def ours_again_phase(run: Run) -> None:
    """With the operator still running: a churn beside Kopf's floor
    (--floors) and our sustainable rate (--rate-search), then nothing may be
    left of them either."""
    args, out = run.args, run.out
    if args.floors and args.kopf_floor_pods > 0:
        out["kopf_floor"] = await floors.kopf_floor_phase(
            run.cluster, run.driver, run.api, args.kopf_floor_pods, args.rate, args.hold,
            args.timeout, run.cpu, say,
        )  # fmt: skip
        run.correctness["kopf_floor_pods_not_gone"] = out["kopf_floor"]["not_gone"]
    if args.rate_search:
        say(f"sustainable rate, ours: p99 created -> ungated <= {args.rate_limit_s}s")
        out["rate_search"] = {"ours": await floors.rate_search(
            run.driver, search(args), load.PodTimes.ungate_latency, "r", args.rate_search_step,
            args.rate_search_hold, args.rate_search_budget, args.timeout, say,
        )}  # fmt: skip
    if args.floors or args.rate_search:
        # The phases above ran ours again: nothing may be left of them either.
        late = await asyncio.to_thread(snapshot.take, run.cluster.snapshot_spec(final=True))
        run.count(late, prefix="after_floors_")


async def floor_phase(run: Run, filled: Filled) -> None:
    """The operator stopped; with --floor-replay the same churn and burst by
    a logic-free writer, and ours against it. Writes `burst` either way."""
    args, out = run.args, run.out
    await asyncio.to_thread(run.cluster.stop_operator)
    await run.tracker.stop()
    await run.clock.stop()
    floor_tp: float | None = None
    floor_burst_cpu: dict[str, Any] | None = None
    if args.floor_replay:
        say("floor: the operator (and its webhooks) stopped; same churn and burst, no logic")
        out["floor"], floor_tp, floor_burst_cpu = await floor_replay(
            run.cluster, run.core, run.limit, filled.placed, args, say
        )
        out["ratios"] = {
            f"{key}_{p}": ratio(out["churn"][key][p], out["floor"]["churn"][key][p])
            for key in ("ungate", "gone")
            for p in ("p50", "p99")
        }
        out["ratios"]["throughput"] = ratio(filled.pods_per_s, floor_tp)
    out["burst"] = {
        "pods": filled.placed, "ours_pods_per_s": filled.pods_per_s, "floor_pods_per_s": floor_tp,
        # Who the burst's CPU went to: on a machine whose cores the burst keeps
        # busy, the throughput ratio is the ratio of these totals per pod.
        "cpu": {"ours": filled.burst_cpu, "floor": floor_burst_cpu},
    }  # fmt: skip


async def baseline_phase(run: Run) -> None:
    """Plain pods with the operator stopped: the churn (--floors) and the
    sustainable rate (--rate-search) of Kubernetes alone."""
    args, cluster, out = run.args, run.cluster, run.out
    if args.floors or args.rate_search:
        await asyncio.to_thread(floors.ensure_namespace, cluster, floors.BASE_NS)
    if args.floors:
        baseline = await floors.baseline_phase(
            cluster, run.core, run.limit, args.pods, args.rate, args.hold, args.timeout,
            run.cpu, say,
        )  # fmt: skip
        out["baseline"] = baseline
        out["ours_minus_baseline"] = floors.compare(out["churn"], baseline)
        run.correctness["baseline_pods_not_gone"] = baseline["not_gone"]
    if args.rate_search:
        say(f"sustainable rate, baseline: p99 created -> scheduled <= {args.rate_limit_s}s")
        btracker = load.Tracker(run.core, floors.BASE_NS, "none")
        btracker.start()
        await btracker.synced.wait()
        bdriver = load.Driver(run.core, floors.BASE_NS, btracker, run.limit, plain=True)
        rs = out["rate_search"]
        rs["baseline"] = await floors.rate_search(
            bdriver, search(args), load.PodTimes.scheduled_latency, "rb", args.rate_search_step,
            args.rate_search_hold, args.rate_search_budget, args.timeout, say,
        )  # fmt: skip
        await btracker.stop()
        rs["ratio_ours_to_baseline"] = ratio(
            rs["ours"]["best_pods_per_s"], rs["baseline"]["best_pods_per_s"]
        )


async def floor_replay(
    cluster: Cluster,
    core: client.CoreV1Api,
    limit: asyncio.Semaphore,
    burst: int,
    args: argparse.Namespace,
    say: Callable[[str], None],
) -> tuple[dict[str, Any], float | None, dict[str, Any]]:
    """The churn and a burst of `burst` fill pods again, the operator's
    writes made by a logic-free script (load.FloorWriter): the floor's
    results, its burst throughput and the burst's CPU (`CpuWindow`)."""
    # The floor writes what the operator writes, so it needs the operator's identity: the
    # protection policies let nobody else create allocations or ungate pods.
    fapi = await load.api_client(cluster.plane.operator_kubeconfig, load.FLOOR_UA, args.concurrency)
    try:
        ftracker = load.Tracker(core, "bench-floor", load.FLOOR_GATE)
        ftracker.start()
        await ftracker.synced.wait()
        writer = load.FloorWriter(fapi, "bench-floor", cluster.nodes)
        fdriver = load.Driver(core, "bench-floor", ftracker, limit, floor=writer)
        fpods = load.mix_pods("c", args.pods)
        profiler = start_profile(cluster, args, "floor-churn")
        churn_cpu = CpuWindow(cluster)
        churn_cpu.start()
        fchurn_s = await load.churn(fdriver, fpods, args.rate, args.hold, args.timeout)
        churn_spent = churn_cpu.stop()
        profiled = await read_profile(cluster, profiler) if profiler else None
        fung = [x for p in fpods if (x := p.ungate_latency()) is not None]
        fgone = [x for p in fpods if (x := p.gone_latency()) is not None]
        template, count = load.FILL
        fburst = [load.PodTimes(f"f-{i:05d}", template, count) for i in range(burst)]
        burst_profiler = start_profile(cluster, args, "floor-burst")
        burst_cpu = CpuWindow(cluster)
        burst_cpu.start()
        ft0 = await load.burst_create(fdriver, fburst)
        await load.wait_until(ftracker, lambda: all(p.ungated for p in fburst), args.timeout)
        spent = burst_cpu.stop()
        burst_profiled = await read_profile(cluster, burst_profiler) if burst_profiler else None
        flast = max((p.ungated for p in fburst if p.ungated), default=ft0)
        floor_tp = len(fburst) / (flast - ft0) if flast > ft0 else None
        await load.delete_all(fdriver, fburst, args.timeout, say)
        await ftracker.stop()
    finally:
        await fapi.close()
    result = {
        "churn": {"duration_s": fchurn_s, "ungate": report.summary(fung),
                  "gone": report.summary(fgone), "cpu_seconds": churn_spent["cpu_seconds"],
                  "machine": churn_spent["machine"]},
        "errors": (fdriver.errors + writer.errors)[:20],
    }  # fmt: skip
    if profiled is not None:
        result["churn_apiserver_cpu"] = profiled
    if burst_profiled is not None:
        result["burst_apiserver_cpu"] = burst_profiled
    return result, floor_tp, spent


def start_profile(
    cluster: Cluster, args: argparse.Namespace, phase: str
) -> apiprofile.ProfileLoop | None:
    """With --apiserver-profile, the API server's profiles through `phase` from now."""
    if not args.apiserver_profile:
        return None
    kubectl = cluster.plane.binary("kubectl")
    loop = apiprofile.ProfileLoop(kubectl, cluster.plane.kubeconfig, cluster.workdir, phase)
    loop.start()
    return loop


async def read_profile(cluster: Cluster, profiler: apiprofile.ProfileLoop) -> dict[str, Any]:
    """Ends `profiler` and reads what it took (bench/apiprofile.py)."""
    files = await asyncio.to_thread(profiler.stop)
    read = await asyncio.to_thread(apiprofile.read, cluster.plane.binary("kube-apiserver"), files)
    if profiler.errors:
        read["profile_errors"] = profiler.errors
    return read


def over_idle(
    churn_cpu: dict[str, float], idle_per_s: dict[str, float], window_s: float, pods: int
) -> dict[str, float]:
    """CPU ms per pod of each process with what it burns idle taken out: for
    the agents, the Lease renewals and resyncs of every node they serve,
    which the churn's CPU includes and which do not grow with pods."""
    return {
        k: 1000 * max(0.0, v - idle_per_s.get(k, 0.0) * window_s) / max(1, pods)
        for k, v in churn_cpu.items()
    }


def search(args: argparse.Namespace) -> Search:
    return Search(start=args.rate, limit_s=args.rate_limit_s, max_rate=args.rate_search_max)


async def _mid_snapshot(cluster: Cluster, args: argparse.Namespace) -> dict[str, int]:
    # Near the churn's peak: creation has run for `hold` seconds.
    await asyncio.sleep(min(args.hold, args.pods / args.rate) + 1)
    # Aside, at the lowest priority: the window it falls in is measured (bench/snapshot.py).
    return await snapshot.aside(cluster.snapshot_spec(final=False))


def add_plane_args(p: argparse.ArgumentParser) -> None:
    """The options every benchmark on a local plane shares."""
    p.add_argument("--concurrency", type=int, default=32, help="driver's in-flight requests")
    p.add_argument("--timeout", type=float, default=180.0, help="per-wait timeout")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    p.add_argument("--workdir", type=Path, default=None, help="keep plane and logs here")


def add_attribution_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attribution",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time each step of every churn pod, say which held the slowest 1%% and which "
        "periodic work overlapped them (bench/steps.py, bench/timeline.py; the plane also "
        "audits our components' lists)",
    )
    p.add_argument(
        "--pauses-ms",
        type=float,
        default=10.0,
        help="the components (and the benchmark) log event-loop and GC pauses at least this "
        "long (VNPU_DEBUG_PAUSES_MS); 0: off",
    )
    p.add_argument(
        "--timeline-out",
        type=Path,
        default=None,
        help="write every churn pod's stamps and the periodic work here as JSON "
        "(seconds from the first creation)",
    )
    p.add_argument("--scale-only", action="store_true", help=argparse.SUPPRESS)


def start_cluster(args: argparse.Namespace, cluster: Cluster, out: dict[str, Any]) -> None:
    """The plane, the agent's base footprint, the nodes, the agents and the
    operator, timed into out["startup"]."""
    if args.pauses_ms:
        os.environ[pauses.ENV] = f"{args.pauses_ms:g}"
    if args.attribution:
        cluster.plane.audit_policy = timeline.AUDIT_POLICY
    cluster.start_plane(say)
    say("agent base footprint (one node)")
    base = cluster.measure_agent_base()
    say(f"creating {args.nodes} kwok nodes")
    t = time.monotonic()
    cluster.add_nodes(cluster.nodes)
    nodes_s = time.monotonic() - t
    say(f"{args.nodes} nodes Ready in {nodes_s:.1f}s; "
        f"starting {cluster.agent_count} agent process(es), then the operator")  # fmt: skip
    t = time.monotonic()
    cluster.start_agents()
    out["startup"] = {"nodes_ready_s": nodes_s,
                      "agents_to_all_vnpunodes_s": time.monotonic() - t,
                      "agent_base_rss_mb": base.peak_rss_mb,
                      "node_files_on_tmpfs": cluster.node_files != cluster.workdir}  # fmt: skip
    t = time.monotonic()
    cluster.start_operator()
    out["startup"]["operator_ready_s"] = time.monotonic() - t
    if cluster.operator:
        # Synced with every node and no pod: what the peak RSS grows from.
        out["startup"]["operator_rss_synced_mb"] = stats(cluster.operator).rss_mb
        out["startup"]["agents_rss_synced_mb"] = sum(stats(a).rss_mb for a in cluster.agents)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of `python -m bench`, --quick applied."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--pods", type=int, default=2000)
    p.add_argument("--rate", type=float, default=20.0, help="pods created per second")
    p.add_argument("--hold", type=float, default=20.0, help="seconds each churn pod lives")
    p.add_argument(
        "--release-rate", type=float, default=0.0,
        help="pods/s at which the fill's freed pods are deleted (0: all at once, a burst)",
    )  # fmt: skip
    p.add_argument("--idle", type=float, default=60.0, help="idle window for writes/s")
    p.add_argument("--agents", type=int, default=1, help="agent processes sharing the nodes")
    add_plane_args(p)
    p.add_argument("--stuck-seconds", type=float, default=30.0, help="gated longer is stuck")
    p.add_argument("--quick", action="store_true", help="20 nodes, 200 pods, hold 10 s, idle 10 s")
    p.add_argument(
        "--pyspy",
        nargs="?",
        const="all",
        choices=("all", "operator"),
        help="sample the operator's and agents' Python stacks (`--pyspy operator`: the "
        "operator's alone) with py-spy during the churn "
        "and the fill's release and report where their CPU went (bench/stacks.py); with "
        "--workdir the raw stacks stay there as <process>.pyspy.txt and "
        "release-<process>.pyspy.txt",
    )
    p.add_argument(
        "--apiserver-profile",
        action="store_true",
        help="take CPU profiles of the kube-apiserver through the churn (ours and the "
        "floor's) and the fill's release and report where its CPU went, per pod in the "
        "churn (bench/apiprofile.py; reading them needs Go); the profiles stay "
        "in the workdir as <phase>-apiserver-<n>.pprof",
    )
    p.add_argument(
        "--floors",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Kopf floor and baseline phases (default: on, off with --quick)",
    )
    p.add_argument(
        "--floor-replay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay the churn and burst with a logic-free writer in place of the operator "
        "(default: on)",
    )
    p.add_argument(
        "--kopf-floor-pods",
        type=int,
        default=None,
        help="pods of the Kopf-floor churn (default: 30 s of --rate, at most --pods)",
    )
    p.add_argument(
        "--rate-search",
        action="store_true",
        help="search the sustainable rate of ours and of baseline (minutes)",
    )
    p.add_argument("--rate-limit-s", type=float, default=1.0, help="p99 a sustainable rate keeps")
    p.add_argument(
        "--rate-search-step",
        type=float,
        default=15.0,
        help="seconds of pod creation per rate tried",
    )
    p.add_argument(
        "--rate-search-hold", type=float, default=2.0, help="seconds each rate-search pod lives"
    )
    p.add_argument(
        "--rate-search-budget",
        type=float,
        default=300.0,
        help="seconds per search (ours, baseline); a step is not started past it",
    )
    p.add_argument(
        "--rate-search-max",
        type=float,
        default=200.0,
        help="the search stops once this rate passes",
    )
    add_attribution_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.hold, args.idle = 20, 200, 10.0, 10.0
    if args.floors is None:
        args.floors = not args.quick
    if args.kopf_floor_pods is None:
        args.kopf_floor_pods = min(args.pods, round(30 * args.rate))
    return args


def machine() -> dict[str, Any]:
    """The cores this run may use (taskset narrows them), of how many, and their model."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus_usable": len(os.sched_getaffinity(0)), "cpus": os.cpu_count(), "model": model}


Starter = Callable[[argparse.Namespace, Cluster, dict[str, Any]], object]
Phases = Callable[[argparse.Namespace, Cluster, dict[str, Any]], Coroutine[Any, Any, None]]


def on_plane(args: argparse.Namespace, agents: int, start: Starter, run: Phases) -> dict[str, Any]:
    """One plane of `args.nodes` nodes and `agents` agent processes (in
    --workdir, else a temporary directory removed after), `start` then `run`
    on it: the results with the options, the machine and the runtime."""
    t0 = time.monotonic()
    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="vnpu-bench-"))
    cluster = Cluster(tmp, args.nodes, agents)
    out: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v)
                                      for k, v in vars(args).items()}}  # fmt: skip
    out["machine"] = machine()
    try:
        start(args, cluster, out)
        asyncio.run(run(args, cluster, out))
    finally:
        cluster.stop()
    if args.workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    out["runtime_s"] = time.monotonic() - t0
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One plane, the phases `args` ask for, the results (not printed)."""
    return on_plane(args, args.agents, start_cluster, phases)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = measure(args)
    write_results(args, out)
    report.print_table(out, lambda: print_attribution(out))
    bad = {k: v for k, v in out["correctness"].items() if v}
    if bad:
        print(f"FAIL: correctness counters not 0: {bad}", file=sys.stderr)
        hint = report.saturation_hint(out, os.cpu_count() or 0, args.stuck_seconds)
        if hint:
            print(f"  {hint}", file=sys.stderr)
        return 1
    return 0
