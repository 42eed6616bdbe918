"""The floors the benchmark measures ours against, in the same run:

- baseline: the same churn with plain pods (no vNPU annotation, operator and
  webhooks gone) through the same plane, scheduler and kwok: what Kubernetes
  itself costs per pod;
- Kopf's floor: bench/kopf_floor.py (empty handlers, the operator's layout
  and settings) next to the operator during a churn, with the bench counting
  the watch events and bytes each component receives (bench/watchcount.py):
  CPU per event of Kopf alone and of ours;
- sustainable rate: bench/rates.py's search, a churn per step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import load, report, watchcount
from bench.cluster import Cluster, proc_stats
from bench.rates import Search, Step
from localplane.components import SOURCE_ROOTS
from localplane.plane import REPO_ROOT
from localplane.waiting import wait_for

Say = Callable[[str], None]
Cpu = Callable[[], dict[str, float]]


class KopfFloorProcess:
    """`python -m bench.kopf_floor` against the plane, as the operator's identity."""

    name = "kopf-floor"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.log_path = cluster.workdir / "kopf-floor.log"
        self.ready_file = cluster.workdir / "kopf-floor.ready"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        plane = self.cluster.plane
        self.ready_file.unlink(missing_ok=True)
        roots = [REPO_ROOT, *(REPO_ROOT / p for p in (*SOURCE_ROOTS, "hack"))]
        env = {**plane.env(), "PYTHONPATH": os.pathsep.join(str(p) for p in roots)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.kopf_floor",
                 f"--kubeconfig={plane.operator_kubeconfig}", f"--ready-file={self.ready_file}"],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        wait_for("Kopf floor synced", self._ready, timeout=timeout)

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(f"Kopf floor exited with {self.proc.returncode}:\n{tail}")
        return self.ready_file.exists()

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return proc_stats(self.proc.pid).cpu_seconds

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def per_event(cpu_s: float | None, events: float) -> float | None:
    """Milliseconds of CPU per event (None without events or CPU figure)."""
    if cpu_s is None or events <= 0:
        return None
    return 1000 * cpu_s / events


async def kopf_floor_phase(
    cluster: Cluster, driver: load.Driver, api: Any, pods: int, rate: float, hold: float,
    timeout: float, cpu: Cpu, say: Say,  # noqa: ASYNC109 - the churn's settle wait
) -> dict[str, Any]:  # fmt: skip
    """A churn of `pods` with the operator and the Kopf floor both running
    and the bench counting every component's watch streams."""
    floor = KopfFloorProcess(cluster)
    say("kopf floor: starting an empty-handler Kopf operator beside ours")
    await asyncio.to_thread(floor.start)
    counting = watchcount.Counting(
        api, watchcount.component_watches(a.nodes for a in cluster.agents)
    )
    try:
        await asyncio.sleep(3)  # its initial listing is not part of the stream
        await counting.start()
        cpu0, f0 = cpu(), floor.cpu_seconds()
        batch = load.mix_pods("k", pods)
        say(f"kopf floor: churn of {pods} pods at {rate}/s, held {hold}s")
        duration = await load.churn(driver, batch, rate, hold, timeout)
        await asyncio.sleep(2)  # the last deletions' trailing events
        cpu1, f1 = cpu(), floor.cpu_seconds()
    finally:
        await counting.stop()
        await asyncio.to_thread(floor.stop)
    counts = watchcount.per_pod(counting.tallies, pods)
    op_events = counts.get("operator", {}).get("events", 0.0) * pods
    agent_events = counts.get("agent", {}).get("events", 0.0) * pods
    op_cpu = cpu1.get("vnpu-operator", 0) - cpu0.get("vnpu-operator", 0)
    agent_cpu = report.agents_total({k: v - cpu0.get(k, 0) for k, v in cpu1.items()})
    out: dict[str, Any] = {
        "pods": pods, "duration_s": duration,
        "watch_per_pod": counts,
        "cpu_seconds": {"operator": op_cpu, "kopf_floor": f1 - f0, "agents": agent_cpu},
        "cpu_ms_per_event": {
            "operator": per_event(op_cpu, op_events),
            "kopf_floor": per_event(f1 - f0, op_events),
            "agents": per_event(agent_cpu, agent_events),
        },
        "cpu_ms_per_pod": {
            "operator": 1000 * op_cpu / max(1, pods),
            "kopf_floor": 1000 * (f1 - f0) / max(1, pods),
            "agents": 1000 * agent_cpu / max(1, pods),
        },
        "not_gone": sum(1 for p in batch if p.created and p.gone is None),
    }  # fmt: skip
    ms = out["cpu_ms_per_event"]
    say(f"kopf floor: {op_events / max(1, pods):.1f} operator events/pod; CPU per event "
        f"ours {report.fmt(ms['operator'], ' ms')}, Kopf alone "
        f"{report.fmt(ms['kopf_floor'], ' ms')}")  # fmt: skip
    return out


async def baseline_phase(
    cluster: Cluster, core: Any, limit: asyncio.Semaphore, pods: int, rate: float, hold: float,
    timeout: float, cpu: Cpu, say: Say,  # noqa: ASYNC109 - the churn's settle wait
) -> dict[str, Any]:  # fmt: skip
    """The churn with plain pods, operator stopped and webhooks gone."""
    tracker = load.Tracker(core, BASE_NS, "none")
    tracker.start()
    await tracker.synced.wait()
    driver = load.Driver(core, BASE_NS, tracker, limit, plain=True)
    batch = load.mix_pods("b", pods)
    say(f"baseline: {pods} plain pods at {rate}/s, held {hold}s (no operator, no webhooks)")
    cpu0 = cpu()
    duration = await load.churn(driver, batch, rate, hold, timeout)
    cpu1 = cpu()
    await tracker.stop()
    cpu_s = {k: round(v - cpu0.get(k, 0), 1) for k, v in cpu1.items()}
    out: dict[str, Any] = {
        "pods": pods, "duration_s": duration,
        "scheduled": report.summary([x for p in batch if (x := p.scheduled_latency()) is not None]),
        "running": report.summary([x for p in batch if (x := p.running_latency()) is not None]),
        "gone": report.summary([x for p in batch if (x := p.gone_latency()) is not None]),
        "cpu_seconds": cpu_s,
        "cpu_ms_per_pod": {k: 1000 * v / max(1, pods) for k, v in cpu_s.items()},
        "not_gone": sum(1 for p in batch if p.created and p.gone is None),
        "errors": driver.errors[:20],
    }  # fmt: skip
    say(f"baseline: running p50 {report.fmt(out['running']['p50'])} "
        f"p99 {report.fmt(out['running']['p99'])}; API server "
        f"{out['cpu_ms_per_pod'].get('kube-apiserver', 0):.1f} ms CPU per pod")  # fmt: skip
    return out


BASE_NS = "bench-base"


def compare(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Ours minus baseline: latencies (p50, p99) and CPU ms per pod by process."""
    out: dict[str, Any] = {}
    for key in ("scheduled", "running", "gone"):
        o, b = ours.get(key) or {}, base.get(key) or {}
        out[key] = {
            p: (o[p] - b[p] if o.get(p) is not None and b.get(p) is not None else None)
            for p in ("p50", "p99")
        }
    oc, bc = ours.get("cpu_ms_per_pod") or {}, base.get("cpu_ms_per_pod") or {}
    out["cpu_ms_per_pod"] = {k: oc.get(k, 0) - bc.get(k, 0) for k in sorted(set(oc) | set(bc))}
    return out


async def rate_search(
    driver: load.Driver, search: Search, latency: Callable[[load.PodTimes], float | None],
    prefix: str, step_s: float, hold: float, budget_s: float, timeout: float, say: Say,  # noqa: ASYNC109
) -> dict[str, Any]:  # fmt: skip
    """Steps of `step_s` seconds of creation at the rates `search` picks,
    within `budget_s`; a step passes if p99 of `latency` <= the limit and
    every pod got there."""
    steps: list[Step] = []
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    last_step_s = 0.0
    reason = ""
    while (rate := search.next_rate(steps)) is not None:
        if rows and time.monotonic() - t0 + last_step_s > budget_s:
            reason = f"time budget {budget_s:.0f}s spent"
            break
        n = max(30, round(rate * step_s))
        batch = load.mix_pods(f"{prefix}{len(steps)}", n, seed=len(steps))
        s0 = time.monotonic()
        await load.churn(driver, batch, rate, hold, timeout)
        last_step_s = time.monotonic() - s0
        values = [x for p in batch if (x := latency(p)) is not None]
        missing = sum(1 for p in batch if p.created and latency(p) is None)
        step = Step(rate, report.pct(values, 99), missing)
        steps.append(step)
        rows.append({"rate": rate, "pods": n, "p50": report.pct(values, 50), "p99": step.p99,
                     "missing": missing, "ok": step.ok(search.limit_s),
                     "seconds": round(last_step_s, 1)})  # fmt: skip
        say(f"  rate {rate:g}/s: p99 {report.fmt(step.p99)}, missing {missing} -> "
            f"{'pass' if step.ok(search.limit_s) else 'fail'}")  # fmt: skip
    return {
        "best_pods_per_s": search.best(steps), "limit_s": search.limit_s,
        "steps": rows, "stopped": reason or search.done_reason(steps),
        "seconds": round(time.monotonic() - t0, 1),
    }  # fmt: skip


def ensure_namespace(cluster: Cluster, ns: str) -> None:
    cluster.plane.kubectl("create", "namespace", ns, check=False)
