"""The correctness snapshot: double-booked vNPU ids and over-committed chips,
from the allocations (one consistent list) and from the simulated drivers;
at the end also leaked vNPUs (simulator against allocations) and allocations
left over.

Taken inside a measured churn, it runs aside (`aside`): in a process of its
own at the lowest CPU priority, reading each simulator's state file without
its lock. Run in the benchmark's process at normal priority, its kubectl and
its 1,800 locked simulator reads at 200 nodes took the cores from the
components, the interpreter from the benchmark's own watches (whose receive
times are the measurements) and each node's lock from its agent, all in the
second the first deletions came, and the floor's replay, which takes no
snapshot, did not pay for it.

`python -m bench.snapshot` reads a `Spec` as JSON on stdin and prints the
counts as JSON."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vnpu_agent.drivers.catalog import Usage, find_model
from vnpu_agent.drivers.sim.state import SimState
from vnpu_common.wire import names

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Spec:
    """What a snapshot reads: the allocations through `kubectl` (its argv up
    to the verb), the simulators of `nodes` under `state_dir`."""

    kubectl: list[str]
    nodes: list[str]
    state_dir: str
    final: bool


def take(spec: Spec) -> dict[str, int]:
    """The snapshot, here and now."""
    return tally(list_allocations(spec.kubectl), read_simulators(spec), spec.nodes, spec.final)


async def aside(spec: Spec) -> dict[str, int]:
    """The snapshot, taken by `python -m bench.snapshot` under `nice -n 19`:
    it gets the cores only when the components leave them idle."""
    proc = await asyncio.create_subprocess_exec(
        "nice", "-n", "19", sys.executable, "-m", "bench.snapshot",
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate(json.dumps(asdict(spec)).encode())
    if proc.returncode != 0:
        raise RuntimeError(
            f"the correctness snapshot failed (exit {proc.returncode}): {err.decode()[-2000:]}"
        )
    return {str(k): int(v) for k, v in json.loads(out).items()}


def list_allocations(kubectl: Sequence[str]) -> list[dict[str, Any]]:
    """Every allocation, one list. A failed list is an error, not zero counts:
    an empty answer would hide the double booking the snapshot looks for."""
    out = subprocess.run(
        [*kubectl, "get", names.ALLOCATION_PLURAL, "-A", "-o", "json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"listing the allocations failed: {out.stderr.strip()[-2000:]}")
    return list(json.loads(out.stdout).get("items", []))


def read_simulators(spec: Spec) -> dict[str, SimState]:
    """Each node's simulator state. Without the lock: the simulator replaces
    its file whole (write, then rename), so a read sees one state, and a
    reader holding no lock never keeps an agent's driver call waiting."""
    states = {}
    for node in spec.nodes:
        path = Path(spec.state_dir) / node / "sim" / "state.json"
        states[node] = SimState.from_json(json.loads(path.read_text(encoding="utf-8")))
    return states


def tally(
    allocs: Iterable[Mapping[str, Any]],
    sims: Mapping[str, SimState],
    nodes: Sequence[str],
    final: bool,
) -> dict[str, int]:
    """The counts, from allocations and simulator states already read.
    Allocations on nodes outside `nodes` (the floor's) are not counted."""
    ours = set(nodes)
    mine = [a for a in allocs if (a.get("spec") or {}).get("nodeName") in ours]
    ids: Counter[tuple[str, int]] = Counter()
    per_chip: dict[tuple[str, int], list[str]] = defaultdict(list)
    for a in mine:
        spec = a["spec"]
        ids[(spec["nodeName"], int(spec["vnpuId"]))] += 1
        per_chip[(spec["nodeName"], int(spec["chip"]))].append(spec["template"])
    models: dict[tuple[str, int], str] = {}
    sim_ids: set[tuple[str, int]] = set()
    sim_chips: dict[tuple[str, int], list[str]] = defaultdict(list)
    for node, state in sims.items():
        for chip in state.chips:
            models[(node, chip.index)] = chip.model
        for v in state.vnpus.values():
            sim_ids.add((node, v.id))
            sim_chips[(node, v.chip)].append(v.template)
    out = {
        "double_booked_ids": sum(1 for n in ids.values() if n > 1),
        "over_capacity_chips_allocations": sum(
            over(models.get(key, ""), tpls) for key, tpls in per_chip.items()
        ),
        "over_capacity_chips_sim": sum(
            over(models.get(key, ""), tpls) for key, tpls in sim_chips.items()
        ),
    }
    if final:
        out["leaked_vnpus"] = len(sim_ids - set(ids))
        out["leftover_allocations"] = len(mine)
    return out


def over(model_name: str, templates: list[str]) -> int:
    """1 if `templates` do not fit on one chip of `model_name` (or either is unknown)."""
    model = find_model(model_name)
    if model is None:
        return 1 if templates else 0
    specs = [model.template(t) for t in templates]
    if any(s is None for s in specs):
        return 1
    u = Usage.of(s for s in specs if s is not None)
    too_much = (
        u.aicore > model.aicore
        or u.memory_mb > model.memory_mb
        or u.aicpu > model.aicpu
        or u.media > model.media
    )
    return 1 if too_much else 0


def main() -> int:
    raw = json.load(sys.stdin)
    print(json.dumps(take(Spec(**raw))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
