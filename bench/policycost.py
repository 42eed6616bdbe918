"""`python -m bench.policycost`: what the protection policies cost the API server.

The chart's ValidatingAdmissionPolicies (`protection.enabled`, on by default)
run inside the API server on every pod CREATE and UPDATE in the cluster, the
kubelet's status writes and pods that never ask for vNPUs included. No webhook
call, no API write, but not free: the API server turns each matched object
into CEL values. This measures that price where every cluster pays it, on
plain pods: the baseline churn of `python -m bench` (no operator, no agent)
in rounds that run with and without the policies on one plane, alternating
which goes first so that a drift of the machine's speed falls on both.
Prints the API server's CPU per pod lifecycle of each round and the medians;
exits 1 if a pod was left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench import floors, load
from bench.cluster import Cluster
from bench.run import add_plane_args, cpu_by_process, say

APISERVER = "kube-apiserver"
WITH, WITHOUT = "with", "without"


async def rounds(args: argparse.Namespace, cluster: Cluster) -> list[dict[str, Any]]:
    api = await load.api_client(cluster.plane.kubeconfig, load.BENCH_UA, args.concurrency)
    core = client.CoreV1Api(api)
    limit = asyncio.Semaphore(args.concurrency)
    rows: list[dict[str, Any]] = []
    try:
        if args.warmup:
            # A fresh plane's first pods cost more (cold caches, new connections):
            # left out so that round 1's mode is not charged for them.
            say(f"warm-up: {args.warmup} plain pods, not counted")
            await floors.baseline_phase(
                cluster, core, limit, args.warmup, args.rate, args.hold, args.timeout,
                lambda: cpu_by_process(cluster), say,
            )  # fmt: skip
        for i in range(args.rounds):
            order = (WITH, WITHOUT) if i % 2 == 0 else (WITHOUT, WITH)
            for mode in order:
                # Both waits (enforced, lifted) probe the API server until it applies the change.
                if mode == WITH:
                    await asyncio.to_thread(cluster.plane.install_policies)
                else:
                    await asyncio.to_thread(cluster.plane.remove_policies)
                say(f"round {i + 1}/{args.rounds}, policies {mode}")
                out = await floors.baseline_phase(
                    cluster, core, limit, args.pods, args.rate, args.hold, args.timeout,
                    lambda: cpu_by_process(cluster), say,
                )  # fmt: skip
                rows.append({
                    "round": i + 1, "policies": mode, "pods": args.pods,
                    "apiserver_ms_per_pod": out["cpu_ms_per_pod"].get(APISERVER, 0.0),
                    "etcd_ms_per_pod": out["cpu_ms_per_pod"].get("etcd", 0.0),
                    "running_p99_s": out["running"]["p99"],
                    "not_gone": out["not_gone"], "errors": out["errors"],
                })  # fmt: skip
    finally:
        await api.close()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {
        mode: [r["apiserver_ms_per_pod"] for r in rows if r["policies"] == mode]
        for mode in (WITH, WITHOUT)
    }
    med = {mode: statistics.median(v) for mode, v in by.items() if v}
    cost = med[WITH] - med[WITHOUT] if len(med) == 2 else None
    return {
        "apiserver_ms_per_pod_median": med,
        "policy_cost_ms_per_pod": cost,
        "policy_cost_share": cost / med[WITHOUT] if cost is not None and med[WITHOUT] else None,
        "spread_ms_per_pod": {mode: (min(v), max(v)) for mode, v in by.items() if v},
    }


def print_table(out: dict[str, Any]) -> None:
    cfg = out["config"]
    print("\n=== protection policies: API server CPU per plain pod lifecycle")
    print(f"  {cfg['nodes']} kwok nodes, {cfg['pods']} pods per round at {cfg['rate']}/s, "
          f"held {cfg['hold']}s, {cfg['rounds']} rounds")  # fmt: skip
    for r in out["rounds"]:
        print(f"  round {r['round']} {r['policies']:<8} API server "
              f"{r['apiserver_ms_per_pod']:6.1f} ms/pod, etcd {r['etcd_ms_per_pod']:5.1f} ms/pod, "
              f"running p99 "
              f"{r['running_p99_s'] or 0:.2f}s")  # fmt: skip
    s = out["summary"]
    med = s["apiserver_ms_per_pod_median"]
    print(f"  median with / without                      {med.get(WITH, 0):.1f} / "
          f"{med.get(WITHOUT, 0):.1f} ms per pod")  # fmt: skip
    if s["policy_cost_ms_per_pod"] is not None:
        print(f"  the policies' cost                         {s['policy_cost_ms_per_pod']:+.1f} ms "
              f"per pod ({100 * s['policy_cost_share']:+.0f}% of the API server's)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.policycost", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--pods", type=int, default=400, help="plain pods per round and mode")
    p.add_argument("--rate", type=float, default=20.0, help="pods created per second")
    p.add_argument("--hold", type=float, default=5.0, help="seconds each pod lives")
    p.add_argument("--rounds", type=int, default=4, help="rounds, each with and without")
    p.add_argument("--warmup", type=int, default=100, help="plain pods first, not counted")
    add_plane_args(p)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.pods < 1 or args.warmup < 0 or args.rate <= 0:
        p.error("--rounds and --pods must be at least 1, --warmup at least 0, --rate above 0")
    start = time.monotonic()
    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="vnpu-policycost-"))
    cluster = Cluster(tmp, args.nodes, agents=1)
    out: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v)
                                      for k, v in vars(args).items()}}  # fmt: skip
    try:
        cluster.start_plane(say)
        say(f"creating {args.nodes} kwok nodes")
        cluster.add_nodes(cluster.nodes)
        floors.ensure_namespace(cluster, floors.BASE_NS)
        out["rounds"] = asyncio.run(rounds(args, cluster))
    finally:
        cluster.stop()
    out["summary"] = summary(out["rounds"])
    out["runtime_s"] = time.monotonic() - start
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str))
    print_table(out)
    if args.workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    left = sum(r["not_gone"] for r in out["rounds"])
    if left:
        print(f"FAIL: {left} pods not gone", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
