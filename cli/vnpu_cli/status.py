"""`kubectl vnpu status`: every node's chips as the placer sees them (used
counts declared allocations and orphans, not the driver's lagging `*_free`),
each node's fragmentation (how many more of the largest templates fit, and
how many would were its free capacity on whole chips) and every vNPU with
its owner."""

from __future__ import annotations

from typing import Any

from vnpu_cli.snapshot import Snapshot, allocation_phase
from vnpu_cli.table import table, triple
from vnpu_common.wire.models import ChipStatus
from vnpu_common.wire.types import Raw
from vnpu_operator.placement import ChipCapacity
from vnpu_operator.placement.fragmentation import Fragmentation, total

ORPHAN = "orphan"
RELEASED = "released"


def cordon_of(vnpu_node: Raw, chip: int) -> str | None:
    """The chip's cordon reason as its VNPUNode declares it
    (`spec.cordonedChips[{chip, reason}]`), None when it is in service. Read
    from the raw object, so a cluster whose CRD predates the field shows '-'."""
    entries = (vnpu_node.get("spec") or {}).get("cordonedChips") or []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("chip") == chip:
            return str(entry.get("reason") or "cordoned")
    return None


def build(snapshot: Snapshot) -> dict[str, Any]:
    """JSON-ready report: nodes in name order, chips in index order, vNPUs in
    id order; a vNPU is in it if its chip lists it or an allocation declares it."""
    ledger = snapshot.ledger()
    capacity: dict[tuple[str, int], ChipCapacity] = {(c.node, c.chip): c for c in ledger.capacity()}
    # (node, chip) -> vNPU id -> (allocation key, raw allocation)
    declared: dict[tuple[str, int], dict[int, tuple[str, Raw]]] = {}
    for a, raw in snapshot.parsed_allocations():
        declared.setdefault((a.node, a.chip), {})[a.vnpu_id] = (a.key, raw)
    raw_nodes = {str((v.get("metadata") or {}).get("name")): v for v in snapshot.vnpunodes}
    figures = ledger.fragmentation()
    nodes = []
    for name in ledger.node_names():
        inventory = ledger.node(name)
        assert inventory is not None  # listed by the ledger itself
        chips = []
        for chip in sorted(inventory.status.chips, key=lambda c: c.index):
            cap = capacity[(name, chip.index)]
            chips.append(
                {
                    "index": chip.index,
                    "model": chip.model,
                    "health": chip.health,
                    "cordon": cordon_of(raw_nodes.get(name, {}), chip.index),
                    "aicore": _amounts(cap.used.aicore, cap.free.aicore, cap.total.aicore),
                    "memoryMB": _amounts(
                        cap.used.memory_mb, cap.free.memory_mb, cap.total.memory_mb
                    ),
                    "aicpu": _amounts(cap.used.aicpu, cap.free.aicpu, cap.total.aicpu),
                    "vnpus": _vnpus(chip, declared.get((name, chip.index), {})),
                }
            )
        nodes.append(
            {
                "name": name,
                "live": inventory.live,
                "driver": inventory.status.driver,
                "chips": chips,
                "fragmentation": _figure(figures[name]),
            }
        )
    return {
        "nodes": nodes,
        "largestTemplates": ledger.largest_templates(),
        "cluster": {"fragmentation": _figure(total(figures.values()))},
    }


def _figure(figure: Fragmentation) -> dict[str, Any]:
    return {
        "freeAICore": figure.free_aicore,
        "largestTemplateAICore": figure.usable_aicore,
        "largestTemplateFits": figure.largest_fits,
        "largestTemplateFitsGathered": figure.ideal_fits,
        "ratio": round(figure.ratio, 2),
    }


def _amounts(used: int, free: int, total: int) -> dict[str, int]:
    return {"used": used, "free": free, "total": total}


def _vnpus(chip: ChipStatus, declared: dict[int, tuple[str, Raw]]) -> list[dict[str, Any]]:
    """`declared`: the allocations on this chip, by vNPU id."""
    present = {v.id: v for v in chip.vnpus}
    out = []
    for vnpu_id in sorted(set(present) | set(declared)):
        key, raw = declared.get(vnpu_id, (None, None))
        if raw is None:
            vnpu = present[vnpu_id]
            # Listed as an allocation's that is gone: destroyed before its
            # finalizer went, listed until the node's next write (which a
            # release puts off), holding nothing. Listed as nobody's: an
            # orphan, holding capacity until the agent collects it.
            out.append(
                {
                    "id": vnpu_id,
                    "template": vnpu.template,
                    "allocation": vnpu.allocation,
                    "pod": None,
                    "phase": RELEASED if vnpu.allocation else ORPHAN,
                    "created": not vnpu.allocation,
                }
            )
            continue
        spec = raw.get("spec") or {}
        namespace = key.partition("/")[0] if key else ""
        out.append(
            {
                "id": vnpu_id,
                "template": spec.get("template"),
                "allocation": key,
                "pod": f"{namespace}/{spec.get('podName')}",
                "phase": allocation_phase(raw),
                "created": vnpu_id in present,
            }
        )
    return out


def text(report: dict[str, Any]) -> str:
    """Three tables: one row per chip (U/F/T: used/free/total), one per node
    with its fragmentation and a cluster line, then one per vNPU."""
    if not report["nodes"]:
        return "No VNPUNodes found: no node runs the vnpu agent.\n"
    chip_rows: list[list[object]] = []
    vnpu_rows: list[list[object]] = []
    for node in report["nodes"]:
        agent = "live" if node["live"] else "not-live"
        for chip in node["chips"]:
            chip_rows.append(
                [
                    node["name"],
                    agent,
                    chip["index"],
                    chip["model"],
                    chip["health"],
                    chip["cordon"],
                    triple(**chip["aicore"]),
                    triple(**chip["memoryMB"]),
                    triple(**chip["aicpu"]),
                    len(chip["vnpus"]),
                ]
            )
            for vnpu in chip["vnpus"]:
                vnpu_rows.append(
                    [
                        node["name"],
                        chip["index"],
                        vnpu["id"],
                        vnpu["template"],
                        vnpu["phase"],
                        vnpu["pod"],
                    ]
                )
    out = table(
        [
            "NODE",
            "AGENT",
            "CHIP",
            "MODEL",
            "HEALTH",
            "CORDON",
            "AICORE U/F/T",
            "MEMORY-MB U/F/T",
            "AICPU U/F/T",
            "VNPUS",
        ],
        chip_rows,
    )
    out += "\n" + _fragmentation_text(report)
    if vnpu_rows:
        out += "\n" + table(["NODE", "CHIP", "VNPU", "TEMPLATE", "PHASE", "POD"], vnpu_rows)
    return out


def _fragmentation_text(report: dict[str, Any]) -> str:
    """FITS: more vNPUs of each chip model's largest template that fit now;
    GATHERED: how many would, were the node's free capacity on whole chips."""
    rows = [
        [
            node["name"],
            node["fragmentation"]["freeAICore"],
            node["fragmentation"]["largestTemplateFits"],
            node["fragmentation"]["largestTemplateFitsGathered"],
            f"{node['fragmentation']['ratio']:.2f}",
        ]
        for node in report["nodes"]
    ]
    out = table(["NODE", "FREE-AICORE", "LARGEST-FITS", "GATHERED", "FRAGMENTATION"], rows)
    cluster = report["cluster"]["fragmentation"]
    largest = ", ".join(f"{m} {t}" for m, t in sorted(report["largestTemplates"].items()))
    return out + (
        f"largest templates: {largest or 'none offered'}\n"
        f"cluster: {cluster['largestTemplateFits']} more fit, "
        f"{cluster['largestTemplateFitsGathered']} gathered on whole chips: "
        f"fragmentation {cluster['ratio']:.2f}\n"
    )
