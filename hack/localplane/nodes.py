"""Fake nodes served by kwok, each optionally carrying simulated NPU chips.

The chip layout is written to the node as the annotation
`names.ANN_SIM_CHIPS` (e.g. `910B3=4,310P3=2`); the agent's sim driver reads
it to build the node's simulated chips, so one declaration drives both the
Kubernetes node and its simulated hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vnpu_common.wire import names

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


@dataclass
class NodeSpec:
    name: str
    chips: Mapping[str, int] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    cpu: str = "64"
    memory: str = "512Gi"
    pods: str = "250"


def format_chips(chips: Mapping[str, int]) -> str:
    return ",".join(f"{model}={count}" for model, count in chips.items())


def parse_chips(text: str) -> dict[str, int]:
    """`910B3=4,310P3=2` -> {"910B3": 4, "310P3": 2}; raises ValueError."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, sep, count = part.partition("=")
        if not sep or not model or not count.isdigit() or int(count) < 1:
            raise ValueError(f"bad chip spec {part!r}: want MODEL=COUNT, e.g. 910B3=4")
        out[model.strip()] = out.get(model.strip(), 0) + int(count)
    return out


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **spec.labels,
    }
    annotations = {KWOK_ANNOTATION: "fake"}
    if spec.chips:
        labels[names.LABEL_NPU_NODE] = "true"
        annotations[names.ANN_SIM_CHIPS] = format_chips(spec.chips)
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": annotations},
        "spec": {"taints": spec.taints},
        "status": {
            "allocatable": resources,
            "capacity": resources,
        },
    }


def node_ready(node: Mapping[str, Any]) -> bool:
    """Whether a Node object's Ready condition is True."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
