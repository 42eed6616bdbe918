"""Objects the agent unit tests hand to a NodeAgent."""

from __future__ import annotations

import copy
from typing import Any

from vnpu_common.wire import names

TEMPLATE = "vir05_1c_16g"  # 5 of a 910B3's 20 AICores: four fit on one chip


def allocation(
    name: str, vnpu_id: int, *, template: str = TEMPLATE, resource_version: str = "1"
) -> dict[str, Any]:
    """Allocation `team-a/<name>` of pod `<name>` on node n1, chip 0."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": name, "namespace": "team-a", "uid": f"uid-{name}",
            "resourceVersion": resource_version, "generation": 1,
            "labels": {names.LABEL_NODE: "n1"}, "finalizers": [names.ALLOCATION_FINALIZER],
        },
        "spec": {"podName": name, "podUID": f"pod-{name}", "nodeName": "n1", "chip": 0,
                 "template": template, "vnpuId": vnpu_id},
    }  # fmt: skip


class RecordingApi:
    """Keeps the VNPUNode status last written and every Event posted."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.events: list[tuple[str, str, str, str]] = []
        self.writes = 0

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        self.status = copy.deepcopy(status)
        meta = {"name": node, "labels": {names.LABEL_NODE: node}}
        return {"metadata": meta, "status": copy.deepcopy(status)}

    async def event(
        self, involved: dict[str, Any], *, type_: str, reason: str, message: str, node: str
    ) -> None:
        self.events.append((involved["kind"], type_, reason, message))


class AllocationApi:
    """Records the agent's allocation writes and answers them as a server
    would: each status write bumps a resourceVersion and returns it."""

    def __init__(self) -> None:
        self.status: dict[str, dict[str, Any]] = {}
        self.finalizers_removed: list[str] = []
        self.rv = 100

    async def patch_allocation_status(
        self, obj: dict[str, Any], status: dict[str, Any]
    ) -> str | None:
        self.status[obj["metadata"]["name"]] = copy.deepcopy(status)
        self.rv += 1
        return str(self.rv)

    async def remove_finalizer(self, obj: dict[str, Any]) -> None:
        self.finalizers_removed.append(obj["metadata"]["name"])

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": node, "labels": {names.LABEL_NODE: node}}, "status": status}

    async def event(self, involved: dict[str, Any], **_: Any) -> None:
        return None
