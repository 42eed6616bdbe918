"""The agent keeps its VNPUNode as it published it (issue 12, item 5): a
VNPUNode deleted, unlabelled or edited by someone else is put back within
seconds, and an agent with nothing to change writes nothing but its Lease.

Real agent process, real control plane, sim driver; writes are counted from
the API server's audit log."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import add_node, allocation, create, get_alloc, phase
from operator_harness import audit_since, component

from localplane import LocalPlane
from localplane.components import AgentProcess
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

# Settle (1 s) plus the coalescing interval (0.2 s) plus a loaded 2-core machine.
RESTORED_WITHIN = 6.0

_counter = iter(range(1000))


@pytest.fixture
def node(plane: LocalPlane) -> str:
    return add_node(plane, f"vnn-node-{next(_counter)}", {"910B3": 2})


@pytest.fixture
def agent(plane: LocalPlane, node: str, tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(plane, tmp_path, [node]).start()
    yield proc
    proc.kill(signal.SIGTERM)
    plane.kubectl("delete", names.NODE_PLURAL, node, "--wait=false", check=False)
    plane.kubectl("delete", "node", node, "--wait=false", check=False)


def vnpunode(plane: LocalPlane, node: str) -> dict[str, Any] | None:
    obj: dict[str, Any] | None = plane.get_json(names.NODE_PLURAL, node)
    return obj


def published(plane: LocalPlane, node: str) -> dict[str, Any]:
    """The VNPUNode once the agent has published its chips."""
    obj = wait_for(
        "VNPUNode published",
        lambda: (o := vnpunode(plane, node)) and o.get("status", {}).get("chips") and o,
    )
    assert isinstance(obj, dict)
    return obj


def restored(plane: LocalPlane, node: str, status: dict[str, Any]) -> float:
    """Seconds until the VNPUNode is labelled for `node` and has `status` again."""
    start = time.monotonic()

    def check() -> bool:
        obj = vnpunode(plane, node)
        return (
            obj is not None
            and obj["metadata"].get("labels", {}).get(names.LABEL_NODE) == node
            and obj.get("status") == status
        )

    wait_for("VNPUNode restored", check, timeout=RESTORED_WITHIN)
    return time.monotonic() - start


def agent_writes(plane: LocalPlane, offset: int, node: str) -> list[str]:
    """The agent's writes about `node`'s VNPUNode and Lease since `offset` of the audit log."""
    ours = {node, names.lease_name(node)}
    out = []
    for e in audit_since(plane, offset):
        ref = e.get("objectRef") or {}
        if component(e) == names.USER_AGENT_AGENT and ref.get("name") in ours:
            resource = ref.get("resource", "") + (
                "/" + ref["subresource"] if ref.get("subresource") else ""
            )
            out.append(f"{e.get('verb')} {resource} {e.get('responseStatus', {}).get('code')}")
    return out


def restorations(agent: AgentProcess, node: str) -> dict[str, float]:
    prefix = f'vnpu_agent_vnpunode_restorations_total{{node="{node}",what="'
    out = {}
    for line in agent.metrics().splitlines():
        if line.startswith(prefix):
            what, value = line[len(prefix) :].split('"} ')
            out[what] = float(value)
    return out


def test_emptied_status_is_restored(plane: LocalPlane, node: str, agent: AgentProcess) -> None:
    before = published(plane, node)
    plane.kubectl(
        "patch", names.NODE_PLURAL, node, "--subresource=status", "--type=json",
        "-p", '[{"op": "remove", "path": "/status"}]',
    )  # fmt: skip
    assert "status" not in (vnpunode(plane, node) or {})
    took = restored(plane, node, before["status"])
    print(f"\nrestored in {took:.1f}s")
    assert restorations(agent, node) == {"status": 1.0}


def test_changed_chip_numbers_are_restored(
    plane: LocalPlane, node: str, agent: AgentProcess
) -> None:
    before = published(plane, node)
    chip = before["status"]["chips"][1]
    plane.kubectl(
        "patch", names.NODE_PLURAL, node, "--subresource=status", "--type=json",
        "-p", json.dumps([
            {"op": "replace", "path": "/status/chips/1/aicoreFree", "value": 0},
            {"op": "replace", "path": "/status/chips/1/memoryFreeMb", "value": 1},
            {"op": "replace", "path": "/status/freeAICore", "value": 0},
        ]),
    )  # fmt: skip
    edited = vnpunode(plane, node) or {}
    assert edited["status"]["chips"][1]["aicoreFree"] == 0 != chip["aicoreFree"]
    restored(plane, node, before["status"])
    assert restorations(agent, node) == {"status": 1.0}


def test_deleted_vnpunode_is_recreated(plane: LocalPlane, node: str, agent: AgentProcess) -> None:
    before = published(plane, node)
    plane.kubectl("delete", names.NODE_PLURAL, node)
    restored(plane, node, before["status"])
    after = vnpunode(plane, node) or {}
    assert after["metadata"]["uid"] != before["metadata"]["uid"]  # a new object
    assert restorations(agent, node) == {"deleted": 1.0}


def test_removed_label_is_restored(plane: LocalPlane, node: str, agent: AgentProcess) -> None:
    before = published(plane, node)
    plane.kubectl("label", names.NODE_PLURAL, node, f"{names.LABEL_NODE}-")
    restored(plane, node, before["status"])
    after = vnpunode(plane, node) or {}
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # the same object, relabelled
    # Leaving the label selection looks like a deletion to the watch.
    assert restorations(agent, node) == {"deleted": 1.0}


def test_own_writes_restore_nothing_and_idle_writes_only_leases(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    """The agent's own VNPUNode writes echo back through its watch: none may
    be taken for someone else's change (a write loop). Once nothing changes,
    only Lease renewals are written."""
    published(plane, node)
    offset = plane.audit_log.stat().st_size
    # Several inventory changes in a row: each one a VNPUNode write and its echo.
    for i in range(4):
        create(plane, namespace, allocation(f"a{i}", node=node, vnpu_id=100 + i))
    wait_for(
        "allocations Ready",
        lambda: all(phase(plane, namespace, f"a{i}") == names.PHASE_READY for i in range(4)),
    )
    # Added vNPUs are written once the settle interval passed: wait for them,
    # or deleting first would leave nothing to write.
    wait_for(
        "VNPUNode lists the four vNPUs",
        lambda: (vnpunode(plane, node) or {}).get("status", {}).get("vnpuCount") == 4,
    )
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "--all", "-n", namespace, "--wait=false")
    wait_for(
        "allocations gone",
        lambda: all(get_alloc(plane, namespace, f"a{i}") is None for i in range(4)),
    )
    wait_for(
        "VNPUNode without vNPUs",
        lambda: (vnpunode(plane, node) or {}).get("status", {}).get("vnpuCount") == 0,
    )
    busy = agent_writes(plane, offset, node)
    assert any("vnpunodes/status" in w for w in busy), busy

    # Past the settle delay of a restore and the coalescing interval: any write
    # still to come would be one nothing called for.
    time.sleep(2)
    idle_from = plane.audit_log.stat().st_size
    time.sleep(6)
    idle = agent_writes(plane, idle_from, node)
    print(f"\nwrites during the churn: {busy}\nwrites while idle: {idle}")
    assert all(w.split()[1] == "leases" for w in idle), idle
    assert restorations(agent, node) == {}
