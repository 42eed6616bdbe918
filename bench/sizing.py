"""The sizing table of docs/PERFORMANCE.md ("Sizing"), worked out from the scaling
runs' files (`make bench-scale`: bench/results-scale.json, and its 2-core Intel run in
bench/runs/2026-11-27-2core-intel-scale/), so the
page's figures are the files', not copied by hand; tests/unit/bench/test_bench_sizing.py
fails when the page and the files disagree.

    python -m bench.sizing        print the table (paste it into PERFORMANCE.md)

For each node count, the higher of the runs' figures: a size must hold on the slower
machine too. The benchmark runs one agent process per 250 nodes; a cluster runs one per
node, so an agent's memory is the process's base (what a process holds before its nodes)
plus one node's share.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = (
    ROOT / "bench" / "results-scale.json",
    ROOT / "bench" / "runs" / "2026-11-27-2core-intel-scale" / "results-scale.json",
)

HEADER = (
    "| nodes (300 pods at 5/s) | operator RSS synced / peak (MB) | operator idle CPU "
    "(millicores) | operator CPU per pod (ms) | agent RSS, one node (MB) | agent idle CPU "
    "per node (millicores) | agent CPU per pod, own code (ms) |"
)
RULE = "|---|---|---|---|---|---|---|"


@dataclass(frozen=True)
class Row:
    nodes: int
    operator_synced_mb: float
    operator_peak_mb: float
    operator_idle_millicores: float
    operator_ms_per_pod: float
    agent_mb: float
    agent_idle_millicores: float
    agent_ms_per_pod: float

    def markdown(self) -> str:
        cells = (
            str(self.nodes),
            f"{self.operator_synced_mb:.0f} / {self.operator_peak_mb:.0f}",
            f"{self.operator_idle_millicores:.1f}",
            f"{self.operator_ms_per_pod:.1f}",
            f"{self.agent_mb:.0f}",
            f"{self.agent_idle_millicores:.2f}",
            f"{self.agent_ms_per_pod:.1f}",
        )
        return "| " + " | ".join(cells) + " |"


def _worst(sizes: Sequence[dict[str, Any]], figure: Callable[[dict[str, Any]], float]) -> float:
    return max(figure(size) for size in sizes)


def rows(runs: Iterable[Path] = RUNS) -> list[Row]:
    """One row per node count found in every run, from the runs' per-node figures."""
    by_nodes: dict[int, list[dict[str, Any]]] = {}
    for path in runs:
        for size in json.loads(path.read_text())["sizes"]:
            by_nodes.setdefault(int(size["nodes"]), []).append(size)
    out = []
    for nodes in sorted(by_nodes):
        sizes = by_nodes[nodes]
        out.append(
            Row(
                nodes=nodes,
                operator_synced_mb=_worst(
                    sizes, lambda s: s["rss_mb_per_node"]["operator_synced"] * s["nodes"]
                ),
                operator_peak_mb=_worst(
                    sizes, lambda s: s["rss_mb_per_node"]["operator_peak"] * s["nodes"]
                ),
                # ms of CPU per second is millicores.
                operator_idle_millicores=_worst(
                    sizes, lambda s: s["idle_cpu_ms_per_s_per_node"]["operator"] * s["nodes"]
                ),
                operator_ms_per_pod=_worst(sizes, lambda s: s["cpu_ms_per_pod"]["operator"]),
                agent_mb=_worst(sizes, _agent_mb),
                agent_idle_millicores=_worst(
                    sizes, lambda s: s["idle_cpu_ms_per_s_per_node"]["agents"]
                ),
                agent_ms_per_pod=_worst(sizes, lambda s: s["cpu_ms_per_pod"]["agents_own_code"]),
            )
        )
    return out


def _agent_mb(size: dict[str, Any]) -> float:
    """An agent that serves one node: its process's base plus one node's share."""
    rss = size["rss_mb_per_node"]
    nodes_per_process = size["nodes"] / size["agents"]
    base = (rss["agents_peak"] - rss["agents_over_base"]) * nodes_per_process
    return float(base + rss["agents_over_base"])


def table(runs: Iterable[Path] = RUNS) -> str:
    return "\n".join([HEADER, RULE, *(row.markdown() for row in rows(runs))])


if __name__ == "__main__":
    print(table())
