"""`python -m bench.placement`: every policy over the same fixed-seed streams
at each offered load, the DRA scheduler's first fit over the published pools
(bench.placement.dra) over the same streams, and the offline best on a small
instance; a table on stdout and the figures as JSON (--out)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.cluster import CHIPS
from bench.load import MIX
from bench.placement import dra, offline, simulate, workload
from vnpu_operator.placement import Policy

POLICIES = (Policy.FIRSTFIT, Policy.BINPACK, Policy.SPREAD, Policy.BESTFIT)
# The table's rows: the annotation path's policies, then the DRA path.
ROWS = (*(p.value for p in POLICIES), dra.NAME)
SMALL_CHIPS = {"910B3": 2, "310P3": 2}


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def _online(args: tuple[Policy, float, int, int, int]) -> dict[str, Any]:
    policy, load, nodes, arrivals, seed = args
    stream = workload.stream(load, nodes, arrivals, seed)
    started = time.process_time()
    # The first third fills the empty cluster (about a lifetime at 95 %).
    outcome = simulate.run(policy, workload.inventories(nodes), stream, warmup=arrivals // 3)
    return {
        "load": load,
        **outcome.to_json(),
        "cpu_seconds": round(time.process_time() - started, 1),
    }


def _dra(args: tuple[float, int, int, int, int]) -> tuple[simulate.Outcome, float]:
    load, nodes, arrivals, seed, tie_break = args
    stream = workload.stream(load, nodes, arrivals, seed)
    started = time.process_time()
    outcome = dra.run(workload.inventories(nodes), stream, seed=tie_break, warmup=arrivals // 3)
    return outcome, time.process_time() - started


def _dra_rows(
    loads: list[float], seeds: list[int], runs: list[tuple[simulate.Outcome, float]]
) -> list[dict[str, Any]]:
    """One row per load: its runs (one per tie-break seed) pooled."""
    rows = []
    for i, load in enumerate(loads):
        mine = runs[i * len(seeds) : (i + 1) * len(seeds)]
        outcomes = [o for o, _ in mine]
        rows.append(
            {
                "load": load,
                **simulate.Outcome.pooled(outcomes).to_json(),
                "tie_break_seeds": seeds,
                "placed_now_fraction_by_seed": [round(o.placed_now_fraction, 4) for o in outcomes],
                "cpu_seconds": round(sum(cpu for _, cpu in mine), 1),
            }
        )
    return rows


def _small(args: tuple[int, int, float]) -> dict[str, Any]:
    seed, arrivals, load = args
    stream = workload.stream(load, 1, arrivals, seed, chips=SMALL_CHIPS)
    row: dict[str, Any] = {"seed": seed, "requests": arrivals}
    row["offline_best"] = offline.best(stream, 1, SMALL_CHIPS)
    for policy in POLICIES:
        inventories = workload.inventories(1, SMALL_CHIPS)
        outcome = simulate.run(policy, inventories, stream, waiting=False)
        row[policy.value] = outcome.placed_now
    inventories = workload.inventories(1, SMALL_CHIPS)
    row[dra.NAME] = dra.run(inventories, stream, seed=seed, waiting=False).placed_now
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--arrivals", type=int, default=12000, help="requests per stream")
    parser.add_argument("--loads", default="0.70,0.85,0.95", help="offered loads, comma list")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--dra-seeds",
        type=int,
        default=10,
        help="tie-break seeds of the DRA scheduler's node pick (from --seed), pooled per load",
    )
    parser.add_argument("--small-seeds", type=int, default=12, help="small instances to solve")
    parser.add_argument("--small-arrivals", type=int, default=14)
    parser.add_argument("--small-load", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    try:
        loads = [float(x) for x in args.loads.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--loads: not a comma list of numbers: {args.loads!r}")
    if not loads or any(not 0 < x < 10 for x in loads):
        parser.error("--loads: each offered load must be between 0 and 10")
    if args.nodes < 1 or args.arrivals < 3 or args.small_seeds < 0 or args.small_arrivals < 1:
        parser.error("--nodes, --arrivals, --small-seeds and --small-arrivals must be positive")
    if args.dra_seeds < 1:
        parser.error("--dra-seeds must be positive")

    runs = [(p, load, args.nodes, args.arrivals, args.seed) for load in loads for p in POLICIES]
    smalls = [
        (args.seed + i, args.small_arrivals, args.small_load) for i in range(args.small_seeds)
    ]
    seeds = [args.seed + i for i in range(args.dra_seeds)]
    dra_runs = [(load, args.nodes, args.arrivals, args.seed, s) for load in loads for s in seeds]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        online = list(pool.map(_online, runs))
        online += _dra_rows(loads, seeds, list(pool.map(_dra, dra_runs)))
        small = list(pool.map(_small, smalls))
    result = {
        "machine": machine(),
        "config": {
            "nodes": args.nodes,
            "chips_per_node": CHIPS,
            "mix": [list(m) for m in MIX],
            "arrivals": args.arrivals,
            "seed": args.seed,
            "dra_tie_break_seeds": seeds,
            "small": {
                "nodes": 1,
                "chips": SMALL_CHIPS,
                "arrivals": args.small_arrivals,
                "load": args.small_load,
                "seeds": args.small_seeds,
            },
        },
        "online": online,
        "small": small,
    }
    print(table(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def table(result: dict[str, Any]) -> str:
    """A Markdown table: what docs/PERFORMANCE.md shows."""
    loads = sorted({r["load"] for r in result["online"]})
    by = {(r["policy"], r["load"]): r for r in result["online"]}
    head = ["policy"]
    head += [f"placed now @{load:.0%}" for load in loads]
    head += [f"largest placed now @{load:.0%}" for load in loads]
    head += [f"util. at 1st largest miss @{load:.0%}" for load in loads]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in ROWS:
        rows = [by[(name, load)] for load in loads]
        cells = [name]
        cells += [f"{r['placed_now_fraction']:.2%}" for r in rows]
        cells += [f"{r['large_placed_now_fraction']:.2%}" for r in rows]
        cells += [
            "never" if r["utilisation_at_first_large_miss"] is None
            else f"{r['utilisation_at_first_large_miss']:.0%}"
            for r in rows
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    small = result["small"]
    if small:
        requests = sum(r["requests"] for r in small)
        best = sum(r["offline_best"] for r in small)
        lines.append("")
        lines.append(
            f"Small instance ({len(small)} streams of {small[0]['requests']} requests, one node, "
            f"no waiting): placed on arrival of {requests}"
        )
        lines.append("")
        lines.append("| offline best | " + " | ".join(ROWS) + " |")
        lines.append("|" + "---|" * (len(ROWS) + 1))
        cells = [str(best)] + [
            f"{sum(r[name] for r in small)} ({sum(r[name] for r in small) - best:+d})"
            for name in ROWS
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
