"""`python -m bench.writecost`: what one VNPUNode status write costs the API server.

An agent writes its node's status as a merge patch of the whole status; the
API server decodes, checks against the CRD schema and encodes the whole
object on each, whatever changed, so a write costs what the object weighs.
This writes the status of the benchmark's node (4 x 910B3, 4 x 310P3, from
the simulated driver, through the agent's own `build_status`) one write at a
time on an idle plane, in rounds that alternate which shape goes first:

- `per chip`: every chip lists its templates (the wire shape before
  status.models, still valid);
- `per model`: each model's list once in status.models (what agents write);
- `no templates`: chips alone, the floor of a status write.

Each write changes one vNPU, as a node's writes do. Prints the API server's
(and etcd's) CPU per write of each shape, the medians and the bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench import load
from bench.cluster import CHIPS, Cluster, proc_stats
from bench.run import say
from vnpu_agent.drivers.base import VNPU
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.inventory import build_status
from vnpu_common.wire import names

PER_CHIP, PER_MODEL, BARE = "per chip", "per model", "no templates"
SHAPES = (PER_CHIP, PER_MODEL, BARE)
MERGE = "application/merge-patch+json"


def statuses(workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """Two statuses per shape, alike but for one vNPU, written in turn."""
    layout = ",".join(f"{model}={count}" for model, count in CHIPS.items())
    (workdir / "sim").mkdir(parents=True, exist_ok=True)
    sim = SimDriver(workdir / "sim" / "state.json", layout)
    chips = sim.list_chips()
    templates = {c.index: sim.list_templates(c.index) for c in chips}
    vnpu = VNPU(
        id=100, chip=chips[0].index, template=templates[chips[0].index][0].name, in_use=False
    )
    alloc = {"metadata": {"namespace": "bench", "name": "a"}, "spec": {"vnpuId": 100}}
    pair = [
        build_status(
            driver="sim",
            chips=chips,
            templates=templates,
            vnpus=v,
            allocations=[alloc],
            conditions=[],
        )
        for v in ({}, {vnpu.id: vnpu})
    ]
    out: dict[str, list[dict[str, Any]]] = {PER_MODEL: pair}
    out[PER_CHIP] = [_per_chip(s) for s in pair]
    out[BARE] = [_bare(s) for s in pair]
    return out


def _per_chip(status: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(status)
    lists = {m["model"]: m["templates"] for m in out.pop("models")}
    for chip in out["chips"]:
        chip.setdefault("templates", lists[chip["model"]])
    return out


def _bare(status: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(status)
    out["models"] = []
    for chip in out["chips"]:
        chip.pop("templates", None)
    return out


async def measure(
    cluster: Cluster, shapes: dict[str, list[dict[str, Any]]], writes: int, rounds: int
) -> list[dict[str, Any]]:
    api = await load.api_client(cluster.plane.kubeconfig, load.BENCH_UA, 4)
    custom = client.CustomObjectsApi(api)
    procs = cluster.plane.procs
    cpu: Callable[[str], float] = lambda name: proc_stats(procs[name].pid).cpu_seconds  # noqa: E731
    # Typed without the client's `_content_type`, which every call takes.
    patch: Callable[..., Awaitable[Any]] = custom.patch_cluster_custom_object_status
    rows: list[dict[str, Any]] = []
    try:
        for shape in SHAPES:
            body = {"apiVersion": names.API_VERSION, "kind": names.NODE_KIND,
                    "metadata": {"name": _node(shape)}}  # fmt: skip
            await custom.create_cluster_custom_object(
                names.GROUP, names.VERSION, names.NODE_PLURAL, body
            )
        for r in range(rounds):
            order = SHAPES if r % 2 == 0 else tuple(reversed(SHAPES))
            for shape in order:
                pair = shapes[shape]
                await asyncio.sleep(1.0)  # the last shape's watch fan-out settles
                before = {n: cpu(n) for n in ("kube-apiserver", "etcd")}
                t0 = time.monotonic()
                for i in range(writes):
                    await patch(
                        names.GROUP, names.VERSION, names.NODE_PLURAL, _node(shape),
                        {"status": pair[i % 2]}, _content_type=MERGE,
                    )  # fmt: skip
                wall = time.monotonic() - t0
                after = {n: cpu(n) for n in ("kube-apiserver", "etcd")}
                row = {
                    "round": r + 1,
                    "shape": shape,
                    "writes": writes,
                    "wall_s": wall,
                    "apiserver_ms_per_write": 1000 * (after["kube-apiserver"]
                                                      - before["kube-apiserver"]) / writes,
                    "etcd_ms_per_write": 1000 * (after["etcd"] - before["etcd"]) / writes,
                }  # fmt: skip
                say(f"round {r + 1}/{rounds}, {shape}: API server "
                    f"{row['apiserver_ms_per_write']:.2f} ms, etcd "
                    f"{row['etcd_ms_per_write']:.2f} ms per write")  # fmt: skip
                rows.append(row)
    finally:
        await api.close()
    return rows


def _node(shape: str) -> str:
    return "wc-" + shape.replace(" ", "-")


def summary(rows: list[dict[str, Any]], shapes: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for shape in SHAPES:
        mine = [r for r in rows if r["shape"] == shape]
        out[shape] = {
            "bytes": len(json.dumps({"status": shapes[shape][1]}, separators=(",", ":"))),
            "apiserver_ms_per_write_median": statistics.median(
                r["apiserver_ms_per_write"] for r in mine
            ),
            "etcd_ms_per_write_median": statistics.median(r["etcd_ms_per_write"] for r in mine),
        }
    return out


def print_table(s: dict[str, Any]) -> None:
    print(f"\n{'VNPUNode status write (8 chips)':<34} {'bytes':>7} {'API server':>11} {'etcd':>8}")
    for shape in SHAPES:
        row = s[shape]
        print(f"  {shape:<32} {row['bytes']:>7} {row['apiserver_ms_per_write_median']:>8.2f} ms "
              f"{row['etcd_ms_per_write_median']:>5.2f} ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.writecost", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--writes", type=int, default=300, help="writes per round and shape")
    p.add_argument("--rounds", type=int, default=4, help="rounds, each with every shape")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    p.add_argument("--workdir", type=Path, default=None, help="keep plane and logs here")
    args = p.parse_args(argv)
    if args.writes < 2 or args.rounds < 1:
        p.error("--writes must be at least 2, --rounds at least 1")
    start = time.monotonic()
    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="vnpu-writecost-"))
    cluster = Cluster(tmp, 1, agents=1)
    shapes = statuses(tmp)
    try:
        cluster.start_plane(say)
        rows = asyncio.run(measure(cluster, shapes, args.writes, args.rounds))
    finally:
        cluster.stop()
    out: dict[str, Any] = {
        "config": {"writes": args.writes, "rounds": args.rounds},
        "rounds": rows,
        "summary": summary(rows, shapes),
        "runtime_s": time.monotonic() - start,
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    print_table(out["summary"])
    if args.workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
