"""`python -m bench.agentnode`: an agent's CPU at one node, empty and full.

No control plane: one `NodeAgent` over the simulated driver on the
benchmark's node (bench.cluster.CHIPS: 4 x 910B3, 4 x 310P3), writing through
an in-process stand-in of the API (as the agent unit tests build one). The
node is filled through the agent itself (allocation events, the vNPUs it
creates, the Ready writes echoed back) with one mix per template the node's
chips offer (that template on every chip of its model until none fits, the
other model's chips filled with the mixed fill) and one mixed fill (each chip
cycling through its model's templates, the next one that fits). At the empty
node and at each full one it times, with time.process_time over many
repetitions (the driver's threads included):

- `resync`: NodeAgent.resync, the periodic work (the driver re-read, the
  requeue check, the orphan collector), the publish it asks for apart;
- `publish`: NodePublisher._publish when the status is unchanged (what each
  resync costs after it: chips re-read, the status built and compared);
- `write`: the same when the status changed in what the allocations do not
  say (the cordon echo flipped each call): built, compared, found news
  (inventory.only_restates) and handed to the API;
- `build`: inventory.build_status alone;
- `event`: a no-op allocation event (a new resourceVersion, nothing else;
  reconciled: validated, its vNPU checked, its CDI spec written, nothing to
  write), and `cycle`: per event of one allocation's release and return
  (deleting, deleted, added, the echo of its Ready write), at the empty
  node one allocation alone;
- `sim`: the simulated driver's calls of a resync (list_chips, list_vnpus
  per chip) and of a publish (list_chips) made directly: the hardware's
  stand-in's share of `resync` and `publish` (each call reads, parses and
  re-serializes the whole state file, so it grows with the vNPUs; a real
  driver's calls are the chips').

Prints one row per node state and, per figure, the least-squares line over
them all (ms at 0 vNPUs, us per vNPU); writes the figures with the machine
(--out).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from bench.cluster import CHIPS
from bench.run import machine
from vnpu_agent.config import AgentSettings
from vnpu_agent.drivers.base import TemplateSpec
from vnpu_agent.drivers.catalog import CATALOG, ChipModel, Usage, capacity_failure
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.inventory import build_status, cordoned_chips
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.node import NodeAgent
from vnpu_common.kube.informer import key_of
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw

NODE = "n1"
LAYOUT = ",".join(f"{model}={count}" for model, count in CHIPS.items())
MIXED = "mixed"
EMPTY = "empty"


class ServerApi:
    """The API as the agent sees it, in process: keeps each allocation as a
    server would (every write bumps its resourceVersion and answers with it)
    and answers VNPUNode writes without copying them."""

    def __init__(self) -> None:
        self.allocs: dict[str, Raw] = {}
        self.rv = 100
        self.node_writes = 0

    def _bump(self, obj: Raw) -> str:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return str(self.rv)

    async def patch_allocation_status(self, obj: Raw, status: dict[str, Any]) -> str | None:
        stored = self.allocs[key_of(obj)]
        stored.setdefault("status", {}).update(status)
        return self._bump(stored)

    async def remove_finalizer(self, obj: Raw) -> None:
        stored = self.allocs[key_of(obj)]
        stored["metadata"]["finalizers"] = []
        self._bump(stored)

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        self.node_writes += 1
        self.rv += 1
        meta = {"name": node, "labels": {names.LABEL_NODE: node}, "resourceVersion": str(self.rv)}
        return {"metadata": meta, "status": status}

    async def event(self, involved: Raw, **_: Any) -> None:
        return None


def allocation(name: str, chip: int, template: str, vnpu_id: int) -> Raw:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": name, "namespace": "bench", "uid": f"uid-{name}", "resourceVersion": "1",
            "generation": 1, "labels": {names.LABEL_NODE: NODE},
            "finalizers": [names.ALLOCATION_FINALIZER],
        },
        "spec": {"podName": name, "podUID": f"pod-{name}", "nodeName": NODE, "chip": chip,
                 "template": template, "vnpuId": vnpu_id},
    }  # fmt: skip


# -- the fills -------------------------------------------------------------------


def _chip_models() -> list[ChipModel]:
    return [CATALOG[model] for model, count in CHIPS.items() for _ in range(count)]


def _fill_chip(model: ChipModel, allowed: list[TemplateSpec]) -> list[TemplateSpec]:
    """Templates placed on one chip of `model` while one of `allowed` still
    fits: each time the next in `allowed`'s cyclic order that fits."""
    placed: list[TemplateSpec] = []
    turn = 0
    while len(placed) < model.ids_per_chip:
        used = Usage.of(placed)
        fitting = [
            i
            for i in range(turn, turn + len(allowed))
            if not capacity_failure(model, 0, used, allowed[i % len(allowed)])
        ]
        if not fitting:
            break
        placed.append(allowed[fitting[0] % len(allowed)])
        turn = fitting[0] + 1
    return placed


def fills() -> dict[str, list[tuple[int, str]]]:
    """Per mix, the (chip, template) of every vNPU of the full node."""
    chips = _chip_models()
    templates = sorted({(m.name, t.name) for m in chips for t in m.templates})
    out: dict[str, list[tuple[int, str]]] = {EMPTY: []}
    for model_name, template in [*templates, ("", MIXED)]:
        vnpus: list[tuple[int, str]] = []
        for index, model in enumerate(chips):
            allowed = list(model.templates)
            if model.name == model_name:
                allowed = [t for t in allowed if t.name == template]
            vnpus += [(index, t.name) for t in _fill_chip(model, allowed)]
        out[MIXED if not model_name else f"{model_name} {template}"] = vnpus
    return out


# -- one node --------------------------------------------------------------------


@dataclass
class Node:
    agent: NodeAgent
    api: ServerApi
    sim: SimDriver
    keys: list[str]


async def new_node(workdir: Path, vnpus: list[tuple[int, str]]) -> Node:
    settings = AgentSettings(
        simulate_nodes=[NODE],
        state_dir=workdir / "state",
        cdi_dir=workdir / "cdi",
        inventory_min_interval_seconds=0,
        inventory_settle_seconds=0,
    )
    sim = SimDriver(workdir / "sim.json", LAYOUT)
    api = ServerApi()
    agent = NodeAgent(NODE, sim, cast(AgentApi, api), settings, AgentMetrics(), synced=lambda: True)
    await agent.view.refresh()
    agent.serving.start()
    # Publishing is timed on its own: here it would run inside every other
    # figure, as a write per change (a real node coalesces them).
    agent.publisher.mark_dirty = lambda *a, **k: None  # type: ignore[method-assign]
    low = {c.index: c.vnpu_id_min for c in agent.view.chips}
    used: dict[int, int] = {}
    keys = []
    for n, (chip, template) in enumerate(vnpus):
        vnpu_id = low[chip] + used.get(chip, 0)
        used[chip] = used.get(chip, 0) + 1
        obj = allocation(f"a{n}", chip, template, vnpu_id)
        keys.append(key_of(obj))
        api.allocs[keys[-1]] = obj
        await agent.on_event("ADDED", copy.deepcopy(obj))
    await agent.serving.queue.idle()
    for key in keys:
        await agent.on_event("MODIFIED", copy.deepcopy(api.allocs[key]))  # the echo
    assert len(agent.view.vnpus) == len(vnpus), (len(agent.view.vnpus), len(vnpus))
    assert all(
        (o.get("status") or {}).get("phase") == names.PHASE_READY for o in api.allocs.values()
    )
    return Node(agent, api, sim, keys)


def _batch_mean(reps: int, run: Callable[[], float]) -> float:
    """Milliseconds of CPU per call over `reps` calls; `run` does one call
    and returns the CPU seconds it timed."""
    return sum(run() for _ in range(reps)) / reps * 1e3


async def _batch_mean_async(reps: int, fn: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Milliseconds of CPU per call: the process's, and the event loop
    thread's alone (the agent's code; the driver's calls run in threads)."""
    total = loop = 0.0
    for _ in range(reps):
        start, start_loop = time.process_time(), time.thread_time()
        await fn()
        total += time.process_time() - start
        loop += time.thread_time() - start_loop
    return total / reps * 1e3, loop / reps * 1e3


class Meter:
    """One node's figures, a batch of `reps` calls each at a time."""

    def __init__(self, node: Node) -> None:
        self.node = node
        agent = node.agent
        meta = {"name": NODE, "labels": {names.LABEL_NODE: NODE}}
        # From a status that echoes no cordon, the first call's differs.
        self._flip = [
            {"metadata": meta, "spec": {"cordonedChips": []}},
            {"metadata": meta, "spec": {"cordonedChips": [{"chip": 7, "reason": "bench"}]}},
        ]
        self._calls = 0
        self.solo = not node.keys
        if self.solo:
            # The empty node: one allocation alone comes and goes.
            low = agent.view.chips[0].vnpu_id_min
            obj = allocation("solo", 0, _chip_models()[0].templates[0].name, low)
            self.key = key_of(obj)
        else:
            self.key = node.keys[-1]

    async def batch(self, reps: int) -> dict[str, float]:
        node, agent = self.node, self.node.agent
        view, pub = agent.view, agent.publisher
        out: dict[str, float] = {"vnpus": len(view.vnpus)}
        out["resync_ms"], out["resync_loop_ms"] = await _batch_mean_async(reps, agent.resync)
        await pub._publish()  # the status as it stands: the next ones are alike
        out["publish_ms"], out["publish_loop_ms"] = await _batch_mean_async(reps, pub._publish)
        writes, self._calls = node.api.node_writes, 0
        out["write_ms"], out["write_loop_ms"] = await _batch_mean_async(reps, self._changed)
        assert node.api.node_writes - writes == reps, "every call writes"
        pub.mirror.observed = self._flip[0]
        await pub._publish()  # no cordon echoed again

        def build() -> float:
            start = time.process_time()
            build_status(
                driver=view.driver.name,
                chips=view.chips,
                templates=view.templates,
                vnpus=view.vnpus,
                allocations=agent.allocs.values(),
                conditions=view.conditions,
                cordoned=cordoned_chips(pub.mirror.observed),
                dra=False,
            )
            return time.process_time() - start

        out["build_ms"] = _batch_mean(reps, build)

        def sim_resync() -> float:
            start = time.process_time()
            for chip in node.sim.list_chips():
                node.sim.list_vnpus(chip.index)
            return time.process_time() - start

        def sim_publish() -> float:
            start = time.process_time()
            node.sim.list_chips()
            return time.process_time() - start

        out["sim_ms"] = _batch_mean(reps, sim_resync)
        out["sim_publish_ms"] = _batch_mean(reps, sim_publish)
        out["event_ms"], out["cycle_ms"] = await self._events(reps)
        return out

    async def _changed(self) -> None:
        # Each call finds the cordon echo flipped: a status that differs in
        # what the allocations do not say, written at once.
        self._calls += 1
        self.node.agent.publisher.mirror.observed = self._flip[self._calls % 2]
        await self.node.agent.publisher._publish()

    async def _events(self, reps: int) -> tuple[float, float]:
        """CPU per no-op event, and per event of one allocation's release and
        return (its own vNPU destroyed and made again through the driver)."""
        spent: list[float] = []

        async def event(kind: str, obj: Raw) -> None:
            # The reconcile it queues included.
            queue = self.node.agent.serving.queue
            start = time.process_time()
            await self.node.agent.on_event(kind, obj)
            await queue.idle()
            spent.append(time.process_time() - start)

        if self.solo:
            await self._add(event)
            spent.clear()
        for _ in range(reps):
            obj = copy.deepcopy(self.node.api.allocs[self.key])
            self.node.api._bump(obj)
            await event("MODIFIED", obj)
        noop = sum(spent) / len(spent) * 1e3
        spent.clear()
        if self.solo:
            await self._release(event)
        for _ in range(max(reps // 4, 1)):
            if self.solo:
                await self._add(event)
                await self._release(event)
            else:
                await self._release(event)
                await self._add(event)
        return noop, sum(spent) / len(spent) * 1e3

    async def _release(self, event: Callable[[str, Raw], Awaitable[None]]) -> None:
        stored = self.node.api.allocs[self.key]
        stored["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"
        self.node.api._bump(stored)
        await event("MODIFIED", copy.deepcopy(stored))
        assert not stored["metadata"]["finalizers"], "released"
        await event("DELETED", copy.deepcopy(stored))

    async def _add(self, event: Callable[[str, Raw], Awaitable[None]]) -> None:
        old = self.node.api.allocs.get(self.key)
        if old is not None:
            spec = old["spec"]
            name = old["metadata"]["name"]
            new = allocation(name, spec["chip"], spec["template"], spec["vnpuId"])
        else:
            chip = self.node.agent.view.chips[0]
            new = allocation("solo", 0, _chip_models()[0].templates[0].name, chip.vnpu_id_min)
        self.node.api.allocs[self.key] = new
        await event("ADDED", copy.deepcopy(new))
        assert (new.get("status") or {}).get("phase") == names.PHASE_READY, new.get("status")
        await event("MODIFIED", copy.deepcopy(new))  # the echo


async def run(reps: int, batches: int, only: list[str] | None) -> dict[str, dict[str, float]]:
    """Every node built first, then measured in turn, batch after batch (a
    change in the machine's load falls on all of them); per figure the
    lowest batch mean is kept (other work on the machine only adds)."""
    with tempfile.TemporaryDirectory(prefix="vnpu-agentnode-") as tmp:
        meters: dict[str, Meter] = {}
        for mix, vnpus in fills().items():
            if only and mix not in only and mix != EMPTY:
                continue
            meters[mix] = Meter(await new_node(Path(tempfile.mkdtemp(dir=tmp)), vnpus))
        for meter in meters.values():
            await meter.batch(max(reps // 4, 1))  # warm-up
        seen: dict[str, list[dict[str, float]]] = {mix: [] for mix in meters}
        order = list(meters)
        for n in range(batches):
            # Each batch starts at another node: none is always first.
            for mix in order[n % len(order) :] + order[: n % len(order)]:
                seen[mix].append(await meters[mix].batch(reps))
        for meter in meters.values():
            meter.node.agent.view.owned.close()
    return {mix: {k: min(b[k] for b in got) for k in got[0]} for mix, got in seen.items()}


FIGURES = ("resync", "resync_loop", "sim", "publish", "publish_loop", "sim_publish", "write",
           "write_loop", "build", "event", "cycle")  # fmt: skip
HEADS = ("resync", "loop", "sim", "publish", "loop", "sim", "write", "loop", "build", "event",
         "cycle")  # fmt: skip


def fit(rows: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per figure, the least-squares line over every node state: ms at 0
    vNPUs and us per vNPU (one mix's difference from the empty node alone is
    within the noise of a loaded machine)."""
    xs = [row["vnpus"] for row in rows.values()]
    mean_x = sum(xs) / len(xs)
    spread = sum((x - mean_x) ** 2 for x in xs) or 1.0
    out: dict[str, dict[str, float]] = {}
    for what in FIGURES:
        ys = [row[f"{what}_ms"] for row in rows.values()]
        mean_y = sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
        out[what] = {"at_0_ms": mean_y - slope * mean_x, "per_vnpu_us": slope * 1e3}
    return out


def table(rows: dict[str, dict[str, float]], line: dict[str, dict[str, float]]) -> str:
    """Milliseconds of CPU per call (`loop`: the event loop thread's alone,
    `sim`: the simulator's calls made directly), and the fitted line."""
    width = max(len(m) for m in (*rows, "per vNPU (us)"))
    cells = [max(len(h), 7) for h in HEADS]
    head = f"{'mix':<{width}}  {'vNPUs':>5}  " + "  ".join(
        f"{h:>{w}}" for h, w in zip(HEADS, cells, strict=True)
    )
    lines = [head]

    def add(name: str, n: str, values: list[float], fmt: str) -> None:
        text = "  ".join(f"{fmt.format(v):>{w}}" for v, w in zip(values, cells, strict=True))
        lines.append(f"{name:<{width}}  {n:>5}  {text}")

    for mix, row in rows.items():
        add(mix, f"{row['vnpus']:.0f}", [row[f"{w}_ms"] for w in FIGURES], "{:.3f}")
    add("fit: at 0 (ms)", "", [line[w]["at_0_ms"] for w in FIGURES], "{:.3f}")
    add("per vNPU (us)", "", [line[w]["per_vnpu_us"] for w in FIGURES], "{:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agentnode", description=__doc__)
    parser.add_argument("--reps", type=int, default=20, help="calls per batch (default 20)")
    parser.add_argument(
        "--batches", type=int, default=10, help="batches (default 10); the lowest is kept"
    )
    parser.add_argument(
        "--mix", action="append", help="only this mix (repeatable; the empty node always)"
    )
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = asyncio.run(run(args.reps, args.batches, args.mix))
    line = fit(rows)
    print(table(rows, line))
    if args.out is not None:
        result = {
            "config": {"reps": args.reps, "batches": args.batches, "chips": CHIPS},
            "machine": machine(),
            "runtime_seconds": round(time.monotonic() - started, 1),
            "nodes": {m: {k: round(v, 4) for k, v in r.items()} for m, r in rows.items()},
            "fit": {w: {k: round(v, 4) for k, v in f.items()} for w, f in line.items()},
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
