"""Failover of the operator's replicas under a churn: the leader killed (or
frozen) again and again while pods come and go, and what that cost: the
time from each kill to the next placement, webhook refusals, and afterwards
allocations double-booked, leaked or stuck.

Used by tests/integration/test_leader_election.py (a few kills, a few
nodes) and by `python -m bench.failover` (the issue's size: 10 kills during
a 200-pod churn; results under bench/).

Replicas are OperatorProcess instances behind `localplane.webhookproxy`, the
stand-in for the webhook Service. A killed replica is started again (same
identity, as a pod's container restarts) once the other has taken over, and
becomes the standby.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from bench import load
from bench.cluster import Cluster
from localplane import sourceroots
from localplane.components import AGENT_NAMESPACE, OperatorProcess, Settings, flags
from localplane.plane import LocalPlane, free_port
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from localplane.webhookproxy import Backend, WebhookProxy
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names
from vnpu_operator.leases import parse_time

LEASE = names.LEADER_LEASE_NAME


def election_settings(
    lease: int, deadline: float, retry: float, base: Settings | None = None
) -> Settings:
    return {
        **(OperatorProcess.QUICK if base is None else base),
        "leader-election-lease-seconds": lease,
        "leader-election-renew-deadline-seconds": deadline,
        "leader-election-retry-seconds": retry,
    }


def _backend(op: OperatorProcess) -> Backend:
    return Backend(lambda: op.webhook_port, lambda: op.port)


class Replicas:
    """`count` operators behind one webhook proxy."""

    def __init__(
        self,
        plane: LocalPlane,
        workdir: Path,
        count: int,
        settings: Settings,
        *,
        ready_timeout: float = 120,
    ) -> None:
        self.plane = plane
        self.proxy = WebhookProxy([])
        self.ready_timeout = ready_timeout
        self.ops = [
            OperatorProcess(
                plane,
                workdir / f"operator-{i}",
                settings=settings,
                name=f"operator-{i}",
                webhook_url=self.proxy.url,
            )
            for i in range(count)
        ]
        self.proxy.backends = [_backend(o) for o in self.ops]

    def start(self) -> Replicas:
        self.proxy.start()
        for op in self.ops:
            op.start(ready_timeout=self.ready_timeout)
        self.wait_leader()
        self.wait_served()
        return self

    def wait_served(self) -> None:
        """Until the proxy sends requests to every running replica (a
        Service's endpoints hold every Ready pod)."""
        running = [op for op in self.ops if op.proc is not None]
        wait_for(
            "every replica behind the webhook proxy",
            lambda: (
                {b.webhook_port() for b in self.proxy.ready} >= {op.webhook_port for op in running}
            ),
            timeout=30,
            interval=0.1,
        )

    def lease(self) -> dict[str, Any]:
        got = self.plane.get_json("lease", "-n", AGENT_NAMESPACE, LEASE)
        return dict(got or {})

    def holder(self) -> str:
        return str((self.lease().get("spec") or {}).get("holderIdentity") or "")

    def leader(self) -> OperatorProcess | None:
        holder = self.holder()
        return next((o for o in self.ops if o.identity == holder and o.proc is not None), None)

    def wait_leader(
        self, other_than: OperatorProcess | None = None, timeout: float = 60
    ) -> OperatorProcess:
        def check() -> OperatorProcess | None:
            op = self.leader()
            return op if op is not None and op is not other_than else None

        found: OperatorProcess = wait_for("a leader", check, timeout=timeout, interval=0.2)
        return found

    def metric(self, op: OperatorProcess, name: str) -> float:
        total = 0.0
        for line in op.metrics().splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        for op in self.ops:
            with contextlib.suppress(Exception):
                if op.proc is not None and op.proc.poll() is None:
                    op.proc.send_signal(signal.SIGCONT)
                op.kill(signal.SIGTERM)
        self.proxy.stop()
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)


@dataclass
class Kill:
    killed: str
    at: float  # monotonic
    wall: float = field(default_factory=time.time)
    took_over: float | None = None  # seconds from the kill to the Lease's new acquireTime
    placed: float | None = None  # the next pod ungated after the kill (monotonic)

    def to_json(self) -> dict[str, Any]:
        return {
            "killed": self.killed,
            "takeover_s": None if self.took_over is None else round(self.took_over, 2),
            "next_placement_s": None if self.placed is None else round(self.placed - self.at, 2),
        }


@dataclass
class ChurnResult:
    kills: list[Kill]
    pods: list[load.PodTimes]
    errors: list[str]
    refusals: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)

    def other_errors(self) -> list[str]:
        refused = {e.split(":")[0].removeprefix("create ") for e in self.refusals}
        return [
            e
            for e in self.errors
            if e not in self.refusals
            and not (e.startswith("delete ") and e.split(":")[0].removeprefix("delete ") in refused)
        ]

    def placements(self) -> list[float]:
        return [k.placed - k.at for k in self.kills if k.placed is not None]

    def summary(self) -> dict[str, Any]:
        placed = sorted(self.placements())
        took = sorted(k.took_over for k in self.kills if k.took_over is not None)
        return {
            "kills": len(self.kills),
            "pods": len(self.pods),
            "kill_to_next_placement_s": {
                "p50": round(statistics.median(placed), 2) if placed else None,
                "max": round(max(placed), 2) if placed else None,
            },
            "kill_to_takeover_s": {
                "p50": round(statistics.median(took), 2) if took else None,
                "max": round(max(took), 2) if took else None,
            },
            "webhook_refusals": len(self.refusals),
            # A refused pod's delete answers 404: not an error of its own.
            "other_errors": len(self.other_errors()),
            "stuck": len(self.stuck),
            "each_kill": [k.to_json() for k in self.kills],
        }


def refused_by_webhook(error: str) -> bool:
    """A create the API server refused because no webhook answered (the
    availability refusals; a webhook's own denial is a 4xx with its reason)."""
    return error.startswith("create ") and (" 500 " in error or "failed calling webhook" in error)


async def churn_with_kills(
    plane: LocalPlane,
    replicas: Replicas,
    namespace: str,
    pods: list[load.PodTimes],
    *,
    rate: float,
    hold: float,
    kills: int,
    first_kill_after: float,
    settle_timeout: float = 180,
    sig: int = signal.SIGKILL,
    say: Callable[[str], None] = lambda _: None,
) -> ChurnResult:
    """Creates `pods` at `rate`/s, each deleted `hold` s after its creation,
    and meanwhile kills the leader with `sig` `kills` times: the first
    `first_kill_after` s into the churn, each next once the previous
    takeover placed a pod and the killed replica is back as the standby
    (SIGTERM: a rollout's or a drain's stop, the Lease handed back)."""
    api = await load.api_client(plane.kubeconfig, load.BENCH_UA, 16)
    try:
        core = client.CoreV1Api(api)
        tracker = load.Tracker(core, namespace, names.SCHEDULING_GATE)
        tracker.start()
        await tracker.synced.wait()
        driver = load.Driver(core, namespace, tracker, asyncio.Semaphore(16))
        done: list[Kill] = []
        churn = asyncio.create_task(load.churn(driver, pods, rate, hold, settle_timeout))
        await asyncio.sleep(first_kill_after)
        for n in range(kills):
            if churn.done():
                break
            kill = await asyncio.to_thread(_kill_leader, replicas, sig)
            done.append(kill)
            kill.placed = await _next_placement(tracker, pods, kill.at, timeout=60)
            kill.took_over = await asyncio.to_thread(_back_as_standby, replicas, kill)
            say(f"kill {n + 1}/{kills}: {kill.to_json()}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(churn, settle_timeout + len(pods) / rate + hold)
        await tracker.stop()
        refusals = [e for e in driver.errors if refused_by_webhook(e)]
        stuck = [p.name for p in pods if p.created is not None and p.gone is None]
        return ChurnResult(done, pods, list(driver.errors), refusals, stuck)
    finally:
        await api.close()


def _kill_leader(replicas: Replicas, sig: int = signal.SIGKILL) -> Kill:
    leader = replicas.wait_leader()
    kill = Kill(leader.identity, time.monotonic())
    leader.kill(sig)
    return kill


async def _next_placement(
    tracker: load.Tracker,
    pods: list[load.PodTimes],
    after: float,
    timeout: float,  # noqa: ASYNC109
) -> float | None:
    def first() -> float | None:
        times = [p.ungated for p in pods if p.ungated is not None and p.ungated > after]
        return min(times) if times else None

    deadline = time.monotonic() + timeout
    while (found := first()) is None and time.monotonic() < deadline:
        tracker.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tracker.changed.wait(), timeout=1.0)
    return found


def _back_as_standby(replicas: Replicas, kill: Kill) -> float | None:
    """Waits for the takeover (returns the seconds from the kill to the
    Lease's new acquireTime), then starts the killed replica again."""
    dead = next(o for o in replicas.ops if o.identity == kill.killed)
    took = None
    with contextlib.suppress(AssertionError):
        replicas.wait_leader(other_than=dead, timeout=60)
        acquired = parse_time((replicas.lease().get("spec") or {}).get("acquireTime"))
        took = None if acquired is None else acquired - kill.wall
    dead.start(ready_timeout=replicas.ready_timeout)
    replicas.wait_served()
    return took


def audit_allocations(plane: LocalPlane, namespace: str | None = None) -> dict[str, list[str]]:
    """Allocations that share a vNPU (node, chip, id) with another one:
    double-booked; every allocation left: leaked once every pod is gone.
    `namespace`: only that namespace's (a test on a shared plane), else all."""
    where = ["-n", namespace] if namespace else ["-A"]
    items = (plane.get_json("vnpuallocations", *where) or {}).get("items", [])
    seen: Counter[tuple[str, int, int]] = Counter()
    for a in items:
        spec = a.get("spec") or {}
        seen[(spec.get("nodeName", ""), spec.get("chip", -1), spec.get("vnpuId", -1))] += 1
    return {
        "double_booked": [f"{k}" for k, n in seen.items() if n > 1],
        "allocations": [f"{a['metadata']['namespace']}/{a['metadata']['name']}" for a in items],
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------- the restart window


@dataclass
class Attempt:
    at: float  # monotonic, when the create was sent
    refused: str = ""  # the API server's answer when it refused the pod


async def create_stream(
    core: client.CoreV1Api,
    namespace: str,
    prefix: str,
    *,
    rate: float,
    seconds: float,
    tracker: load.Tracker,
) -> list[Attempt]:
    """Creates one vNPU pod every 1/`rate` s for `seconds`; each attempt
    with its refusal, if any."""
    attempts: list[Attempt] = []
    tasks: list[asyncio.Task[None]] = []
    t0 = time.monotonic()

    async def one(i: int) -> None:
        pod = load.PodTimes(f"{prefix}-{i:04d}", "vir05_1c_16g", 1)
        tracker.add(pod)
        attempt = Attempt(time.monotonic())
        attempts.append(attempt)
        pod.create_sent = attempt.at
        body = vnpu_pod(pod.name, namespace, template=pod.template, labels={"app": prefix})
        try:
            await call_json(core.create_namespaced_pod, namespace, body)
            pod.created = time.monotonic()
        except ApiException as exc:
            attempt.refused = f"{exc.status} {exc.reason}: {str(exc.body)[:200]}"

    i = 0
    while time.monotonic() - t0 < seconds:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
    await asyncio.gather(*tasks)
    return attempts


def refusal_window(attempts: list[Attempt], killed: float) -> dict[str, Any]:
    refused = [a for a in attempts if a.refused]
    after = [a for a in attempts if a.at >= killed]
    first_ok = next((a.at for a in after if not a.refused), None)
    return {
        "attempts": len(attempts),
        "refused": len(refused),
        "refused_window_s": round(refused[-1].at - refused[0].at, 2) if refused else 0.0,
        "kill_to_first_admitted_s": None if first_ok is None else round(first_ok - killed, 2),
        "example": refused[0].refused if refused else "",
    }


async def restart_window(
    plane: LocalPlane,
    namespace: str,
    prefix: str,
    kill: Callable[[], float],
    *,
    rate: float,
    before: float,
    after: float,
) -> dict[str, Any]:
    """Pods created at `rate`/s; `before` s in, `kill()` (returns when it
    killed, monotonic); `after` s more. What the API server refused, and
    when placements resumed."""
    api = await load.api_client(plane.kubeconfig, load.BENCH_UA, 16)
    try:
        core = client.CoreV1Api(api)
        tracker = load.Tracker(core, namespace, names.SCHEDULING_GATE)
        tracker.start()
        await tracker.synced.wait()
        stream = asyncio.create_task(
            create_stream(
                core, namespace, prefix, rate=rate, seconds=before + after, tracker=tracker
            )
        )
        await asyncio.sleep(before)
        killed = await asyncio.to_thread(kill)
        attempts = await stream
        # Pods sent after the kill: one the dying leader ungated an instant
        # before it can reach the watch after the kill and read as 0 s.
        after_kill = [p for p in tracker.pods.values() if (p.create_sent or 0) > killed]
        placed = await _next_placement(tracker, after_kill, killed, timeout=60)
        await tracker.stop()
    finally:
        await api.close()
    return {
        **refusal_window(attempts, killed),
        "kill_to_next_placement_s": None if placed is None else round(placed - killed, 2),
    }


# ---------------------------------------------------------------- python -m bench.failover


class BeforeOperator(OperatorProcess):
    """The operator of another source tree (`git archive` of the commit
    before high availability): one replica, no leader election."""

    def __init__(self, tree: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tree = tree

    def start(self, *, ready_timeout: float = 60) -> OperatorProcess:
        self.port = free_port()
        args = [
            f"--kubeconfig={self.plane.operator_kubeconfig}",
            f"--agent-namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.port}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-url=https://127.0.0.1:{self.webhook_port}",
            *flags(self.settings),
        ]
        roots = ["common", "operator", "node_agent", "cli", "hack", "."]
        path = os.pathsep.join(str(self.tree / r) for r in roots)
        with mock.patch.object(sourceroots, "pythonpath", return_value=path):
            self.launch(args, self.plane.env(), ready_timeout=ready_timeout)
        return self


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    return f"{os.cpu_count()} cores, {model}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--pods", type=int, default=200, help="pods of the churn")
    parser.add_argument("--rate", type=float, default=1.0, help="churn pods per second")
    parser.add_argument("--hold", type=float, default=40.0, help="seconds each pod lives")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease", type=int, default=4)
    parser.add_argument("--deadline", type=float, default=3.0)
    parser.add_argument("--retry", type=float, default=0.5)
    parser.add_argument("--stream-rate", type=float, default=4.0, help="pods/s around a restart")
    parser.add_argument(
        "--before", type=Path, default=None,
        help="a source tree without high availability: measure its single replica's restart",
    )  # fmt: skip
    parser.add_argument("--skip-churn", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vnpu-bench-failover"))
    parser.add_argument("--out", type=Path, default=Path("bench/results-failover.json"))
    args = parser.parse_args()

    def say(msg: str) -> None:
        print(f"[failover {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    shutil.rmtree(args.workdir, ignore_errors=True)
    cluster = Cluster(args.workdir, args.nodes, args.agents)
    out: dict[str, Any] = {
        "machine": machine(),
        "nodes": args.nodes,
        "election": {"lease_s": args.lease, "renew_deadline_s": args.deadline,
                     "retry_s": args.retry},
    }  # fmt: skip
    try:
        cluster.start_plane(say)
        cluster.add_nodes(cluster.nodes)
        cluster.start_agents()
        say(f"{args.nodes} nodes, {len(cluster.agents)} agents")
        plane = cluster.plane
        for ns in ("restart-before", "restart-after", "churn"):
            plane.kubectl("create", "namespace", ns)
        settings = election_settings(
            args.lease, args.deadline, args.retry, base={"log-level": "INFO"}
        )

        if args.before is not None:
            old = BeforeOperator(
                args.before, plane, args.workdir / "before", settings={"log-level": "INFO"},
                name="operator-before",
            ).start(ready_timeout=180)  # fmt: skip

            def restart_old() -> float:
                old.kill(signal.SIGKILL)
                killed = time.monotonic()
                old.start(ready_timeout=0)  # the kubelet restarts the container at once
                return killed

            out["single_replica_restart_before"] = asyncio.run(
                restart_window(plane, "restart-before", "rb", restart_old,
                               rate=args.stream_rate, before=10, after=40)
            )  # fmt: skip
            say(f"before: {out['single_replica_restart_before']}")
            wait_for("old operator ready", old.ready, timeout=120)
            delete_all(plane, "restart-before")
            old.stop()
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)

        replicas = Replicas(plane, args.workdir, 2, settings, ready_timeout=180).start()
        try:

            def kill_leader() -> float:
                return _kill_leader(replicas).at

            out["leader_kill_two_replicas"] = asyncio.run(
                restart_window(plane, "restart-after", "ra", kill_leader,
                               rate=args.stream_rate, before=10, after=args.lease + 15)
            )  # fmt: skip
            say(f"after: {out['leader_kill_two_replicas']}")
            for op in replicas.ops:
                if op.proc is None:
                    op.start(ready_timeout=180)
            replicas.wait_served()
            delete_all(plane, "restart-after")

            if not args.skip_churn:
                pods = load.mix_pods("churn", args.pods)
                for p in pods:
                    p.template, p.count = "vir05_1c_16g", 1
                result = asyncio.run(
                    churn_with_kills(
                        plane, replicas, "churn", pods, rate=args.rate, hold=args.hold,
                        kills=args.kills, first_kill_after=args.hold, say=say,
                    )
                )  # fmt: skip
                out["churn_with_kills"] = result.summary()
                audit = audit_allocations(plane)
                out["churn_with_kills"]["double_booked"] = len(audit["double_booked"])
                out["churn_with_kills"]["leaked_allocations"] = len(audit["allocations"])
                say(f"churn: {out['churn_with_kills']}")
        finally:
            replicas.stop()
    finally:
        cluster.stop()
        write_json(args.out, out)
        say(f"wrote {args.out}")


def delete_all(plane: LocalPlane, namespace: str) -> None:
    plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
    wait_for(
        f"pods of {namespace} gone",
        lambda: not (plane.get_json("pods", "-n", namespace) or {}).get("items"),
        timeout=180,
        interval=2,
    )


if __name__ == "__main__":
    main()
