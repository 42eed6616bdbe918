"""A DRA node's pool on the real API server (docs/DRA.md, "What the agent
publishes"): an agent with --dra and the sim driver on a kwok node publishes
ResourceSlices the API server accepts (its validation is the proof), says
status.dra on the VNPUNode, and republishes every slice with the next
generation when a chip is cordoned or turns unhealthy (that chip's devices
go, its counters stay), or when a foreign vNPU takes room on a chip (its
counters drop by the vNPU's size). Slices deleted by someone else (the
kubelet wipes a node's slices at its start) are back within seconds, from
the agent's watch, not its 300 s re-read. The slices are owned by the Node:
they go with it.

On a 1.34 or 1.35 plane the API server drops the fields of partitionable
devices and binding conditions (gates off), so only what 1.34 keeps is
checked there; the shape checks need 1.36+ (the main lane, 1.37).
Unit tests of the same: tests/unit/agent/test_dra_pool_slices.py, test_dra_pool.py."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import add_node

from localplane import LocalPlane
from localplane.components import AgentProcess
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

_counter = iter(range(1000))


def server_minor(plane: LocalPlane) -> int:
    out = json.loads(plane.kubectl("version", "-o", "json").stdout)
    return int(str(out["serverVersion"]["minor"]).rstrip("+"))


@pytest.fixture
def node(plane: LocalPlane) -> Iterator[str]:
    name = add_node(plane, f"dras-node-{next(_counter)}", {"910B3": 2})
    yield name
    plane.kubectl("delete", names.NODE_PLURAL, name, "--wait=false", check=False)
    plane.kubectl("delete", "node", name, "--wait=false", check=False)


@pytest.fixture
def agent(plane: LocalPlane, node: str, tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(plane, tmp_path, [node], extra=["--dra=true"]).start()
    yield proc
    proc.kill(signal.SIGTERM)


def pool(plane: LocalPlane, node: str) -> list[dict[str, Any]]:
    # By spec.nodeName: 1.34 has no field selector on spec.pool.name.
    out = plane.get_json(
        "resourceslices", "--field-selector", f"spec.driver=vnpu.io,spec.nodeName={node}"
    )
    items = [s for s in (out or {}).get("items") or [] if s["spec"]["pool"]["name"] == node]
    return sorted(items, key=lambda s: s["metadata"]["name"])


def complete(
    plane: LocalPlane, node: str, generation: int, agent: AgentProcess
) -> list[dict[str, Any]]:
    """The pool once all its slices are at `generation` (or above) and all
    there; the agent's log when it does not come."""

    def check() -> list[dict[str, Any]] | None:
        slices = pool(plane, node)
        gens = {s["spec"]["pool"]["generation"] for s in slices}
        counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
        if len(gens) == 1 and min(gens) >= generation and counts == {len(slices)}:
            return slices
        return None

    try:
        found = wait_for(f"pool of {node} at generation {generation}", check, timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nagent log:\n{agent.log_tail(40)}") from None
    assert isinstance(found, list)
    return found


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def taints(slices: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {n: [t["key"] for t in d.get("taints") or []] for n, d in devices(slices).items()}


def test_the_pool_is_accepted_and_republished_on_cordon_and_health(
    plane: LocalPlane, node: str, agent: AgentProcess
) -> None:
    full = server_minor(plane) >= 36
    first = complete(plane, node, 1, agent)
    generation = first[0]["spec"]["pool"]["generation"]
    names_ = [s["metadata"]["name"] for s in first]
    uid = plane.get_json("node", node)["metadata"]["uid"]
    for s in first:
        assert s["spec"]["nodeName"] == node
        assert s["spec"]["driver"] == names.DRA_DRIVER
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
        ]
    vnpunode = wait_for(
        "status.dra",
        lambda: (
            (o := plane.get_json(names.NODE_PLURAL, node))
            and o.get("status", {}).get("dra") is True
            and o
        ),
    )
    assert vnpunode["status"]["dra"] is True
    # Two 910B3: 4 x vir05_1c_16g + 2 x vir10_3c_32g each.
    assert sorted(devices(first)) == sorted(
        f"npu-{chip}-{t}-{n}"
        for chip in (0, 1)
        for t, count in (("vir05-1c-16g", 4), ("vir10-3c-32g", 2))
        for n in range(count)
    )
    if full:
        assert names_ == [f"{node}-vnpu-counters-000", f"{node}-vnpu-devices-000"]
        assert first[0]["spec"]["sharedCounters"][1] == {
            "name": "npu-1",
            "counters": {
                "aicore": {"value": "20"}, "memory-mb": {"value": "65536"},
                "aicpu": {"value": "7"}, "media": {"value": "9"}, "vnpus": {"value": "16"},
            },
        }  # fmt: skip
        device = devices(first)["npu-1-vir10-3c-32g-1"]
        assert device["consumesCounters"] == [
            {"counterSet": "npu-1", "counters": {
                "aicore": {"value": "10"}, "memory-mb": {"value": "32768"},
                "aicpu": {"value": "3"}, "media": {"value": "4"}, "vnpus": {"value": "1"},
            }}
        ]  # fmt: skip
        assert device["bindsToNode"] is True
        assert device["bindingConditions"] == [names.DRA_COND_READY]
        assert device["bindingFailureConditions"] == [names.DRA_COND_FAILED]
        assert device["attributes"] == {
            "template": {"string": "vir10_3c_32g"}, "model": {"string": "910B3"},
            "chip": {"int": 1}, "aicore": {"int": 10}, "memoryMB": {"int": 32768},
        }  # fmt: skip
    assert not any(taints(first).values())

    # An admin cordons chip 1: every slice at the next generation, chip 1's
    # devices gone (no toleration can reach them), its counters kept.
    plane.kubectl(
        "patch", names.NODE_PLURAL, node, "--type=merge",
        "-p", json.dumps({"spec": {"cordonedChips": [{"chip": 1, "reason": "dra test"}]}}),
    )  # fmt: skip
    cordoned = complete(plane, node, generation + 1, agent)
    if full:
        assert sorted(devices(cordoned)) == sorted(
            n for n in devices(first) if n.startswith("npu-0-")
        )
        assert [c["name"] for c in cordoned[0]["spec"]["sharedCounters"]] == ["npu-0", "npu-1"]
    assert [s["metadata"]["name"] for s in cordoned] == names_

    # The driver reports chip 0 unhealthy: the next generation offers no device.
    agent.sim(node).set_chip_health(0, False)
    sick = complete(plane, node, generation + 2, agent)
    if full:
        assert devices(sick) == {}
        assert [s["metadata"]["name"] for s in sick] == [f"{node}-vnpu-counters-000"]
    assert {s["spec"]["pool"]["generation"] for s in sick} == {generation + 2}


def counters_of(slices: list[dict[str, Any]], chip: int) -> dict[str, str]:
    for s in slices:
        for cs in s["spec"].get("sharedCounters") or []:
            if cs["name"] == f"npu-{chip}":
                return {k: v["value"] for k, v in cs["counters"].items()}
    raise AssertionError(f"no counter set npu-{chip}")


def test_a_foreign_vnpu_takes_its_size_from_the_chips_counters(
    plane: LocalPlane, node: str, agent: AgentProcess
) -> None:
    if server_minor(plane) < 36:
        pytest.skip("counters need partitionable devices (1.36+)")
    first = complete(plane, node, 1, agent)
    generation = first[0]["spec"]["pool"]["generation"]
    assert counters_of(first, 0)["aicore"] == "20"
    # Made by hand, beside the agent (the default policy keeps it).
    agent.sim(node).create_vnpu(0, "vir10_3c_32g", 110)
    held = complete(plane, node, generation + 1, agent)
    assert counters_of(held, 0) == {
        "aicore": "10", "memory-mb": "32768", "aicpu": "4", "media": "5", "vnpus": "15",
    }  # fmt: skip
    assert counters_of(held, 1)["aicore"] == "20"
    # The devices stay: the counters are what the scheduler checks.
    assert sorted(devices(held)) == sorted(devices(first))


def test_slices_deleted_by_someone_else_come_back_within_seconds_and_go_with_the_node(
    plane: LocalPlane, node: str, agent: AgentProcess
) -> None:
    """The agent runs with the default --dra-verify-seconds (300): only its
    watch of the pool can bring the slices back this fast."""
    first = complete(plane, node, 1, agent)
    generation = first[0]["spec"]["pool"]["generation"]
    # As the kubelet does at its start: every slice of the node.
    plane.kubectl(
        "delete", "resourceslices", "--field-selector", f"spec.nodeName={node}", "--wait=true"
    )
    start = time.monotonic()
    again = wait_for(
        "pool back",
        lambda: (got := pool(plane, node)) and len(got) == len(first) and got,
        timeout=15,
    )
    took = time.monotonic() - start
    assert took < 10, f"the pool came back after {took:.1f}s"
    assert [s["metadata"]["name"] for s in again] == [s["metadata"]["name"] for s in first]
    assert {s["spec"]["pool"]["generation"] for s in again} == {generation + 1}
    # Nothing differs now: no further write (the generation stays).
    time.sleep(3)
    assert {s["spec"]["pool"]["generation"] for s in pool(plane, node)} == {generation + 1}
    # The Node goes: the garbage collector takes its pool (ownerReferences).
    plane.kubectl("delete", "node", node)
    wait_for("pool collected with its node", lambda: pool(plane, node) == [], timeout=60)
    assert agent.proc is not None
    assert agent.proc.poll() is None, "the agent must outlive its node's deletion"


def test_a_node_whose_agent_runs_without_dra_loses_its_pool(
    plane: LocalPlane, node: str, tmp_path: Path
) -> None:
    # One state directory, as the DaemonSet's hostPath keeps it across the restart:
    # it says the node served DRA (dra/served.py).
    proc = AgentProcess(plane, tmp_path / "agent", [node], extra=["--dra=true"]).start()
    try:
        complete(plane, node, 1, proc)
    finally:
        proc.kill(signal.SIGTERM)
    plain = AgentProcess(plane, tmp_path / "agent", [node]).start()
    try:
        wait_for("pool deleted", lambda: pool(plane, node) == [], timeout=20)
    finally:
        plain.kill(signal.SIGTERM)
