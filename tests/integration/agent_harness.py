"""Creates allocations the way the operator does, for tests of the agent
(`localplane.components.AgentProcess` runs it)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE
from vnpu_common.wire import names


def add_node(plane: LocalPlane, name: str, chips: dict[str, int]) -> str:
    """Adds kwok node `name` with simulated `chips`, and the agents' namespace if
    missing; returns the name."""
    plane.add_nodes([NodeSpec(name=name, chips=chips)])
    if plane.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode != 0:
        plane.kubectl("create", "namespace", AGENT_NAMESPACE)
    return name


def allocation(
    name: str,
    *,
    node: str,
    vnpu_id: int,
    template: str = "vir05_1c_16g",
    chip: int = 0,
    pod: str = "pod",
    pod_uid: str = "uid",
) -> dict[str, Any]:
    """An allocation exactly as the operator writes it."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": name,
            "labels": {names.LABEL_NODE: node, names.LABEL_POD_UID: pod_uid},
            "finalizers": [names.ALLOCATION_FINALIZER],
        },
        "spec": {
            "podName": pod,
            "podUID": pod_uid,
            "nodeName": node,
            "chip": chip,
            "template": template,
            "vnpuId": vnpu_id,
        },
    }


def create(plane: LocalPlane, namespace: str, obj: dict[str, Any]) -> None:
    """Creates `obj` as the operator: nobody else may create allocations."""
    plane.kubectl(
        "create", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj),
        kubeconfig=plane.operator_kubeconfig,
    )  # fmt: skip


def get_alloc(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any] | None:
    r = plane.kubectl(
        "get", names.ALLOCATION_PLURAL, name, "-n", namespace, "-o", "json", check=False
    )
    if r.returncode != 0:
        assert "NotFound" in r.stderr, r.stderr
        return None
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def phase(plane: LocalPlane, namespace: str, name: str) -> str | None:
    obj = get_alloc(plane, namespace, name)
    return None if obj is None else obj.get("status", {}).get("phase")
