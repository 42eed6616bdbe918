"""The agent, as a real process on the real control plane, refuses to switch a
node between front-ends while the node holds live allocations of the other
kind (vnpu_agent/modes.py): it names them and exits 2, and every allocation
and vNPU stays as it was (issue 54, item 9)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from agent_harness import add_node, allocation, create, phase

from localplane import LocalPlane
from localplane.components import AGENT_NAMESPACE, AgentProcess, vnpu_ids
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

_counter = iter(range(1000))


def _exits(proc: AgentProcess, timeout: float = 30) -> int:
    assert proc.proc is not None
    try:
        return proc.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the agent kept running:\n{proc.log_tail(40)}") from None


def _release(plane: LocalPlane, namespace: str, agent: AgentProcess) -> None:
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "--all", "-n", namespace, "--wait=false")
    wait_for(
        "the allocations released",
        lambda: not (plane.get_json(names.ALLOCATION_PLURAL, "-n", namespace) or {}).get("items"),
        30,
    )
    agent.kill(signal.SIGTERM)


@pytest.mark.parametrize("kind", ["annotated", "claim"])
def test_a_mode_switch_with_live_allocations_of_the_other_kind_is_refused(
    plane: LocalPlane, namespace: str, tmp_path: Path, kind: str
) -> None:
    node = add_node(plane, f"modes-node-{next(_counter)}", {"910B3": 1})
    obj = allocation("held", node=node, vnpu_id=100)
    if kind == "claim":
        obj["spec"]["claim"] = {"name": "c", "uid": "c-uid", "request": "npu", "device": "d"}
    served_mode = ["--dra=true"] if kind == "claim" else []
    other_mode = [] if kind == "claim" else ["--dra=true"]
    create(plane, namespace, obj)
    first = AgentProcess(plane, tmp_path / "a", [node], extra=served_mode).start()
    wait_for("the allocation Ready", lambda: phase(plane, namespace, "held") == "Ready", 30)
    first.kill(signal.SIGTERM)

    switched = AgentProcess(plane, tmp_path / "a", [node], extra=other_mode)
    switched.start(ready_timeout=0)
    assert _exits(switched) == 2, switched.log_tail(40)
    log = switched.log_tail(40)
    assert f"node {node} holds 1 live allocation(s)" in log
    assert f"{namespace}/held" in log
    # Nothing moved: the allocation is Ready and held, its vNPU is there.
    alloc = plane.get_json(names.ALLOCATION_PLURAL, "held", "-n", namespace)
    assert alloc["status"]["phase"] == "Ready"
    assert names.ALLOCATION_FINALIZER in alloc["metadata"]["finalizers"]
    assert vnpu_ids(switched.sim(node)) == {100: "vir05_1c_16g"}

    # Back in its own mode, the agent serves the node and releases as ever.
    again = AgentProcess(plane, tmp_path / "a", [node], extra=served_mode).start()
    _release(plane, namespace, again)
    _forget(plane, node)


def _forget(plane: LocalPlane, node: str) -> None:
    """The node goes with its pool (its slices are the Node's), VNPUNode and
    Lease: a DRA node left with no agent would be offered to later modules'
    claims on the shared plane."""
    plane.kubectl("delete", "node", node, "--wait=false")
    plane.kubectl("delete", "vnpunode", node, "--ignore-not-found", "--wait=false")
    plane.kubectl("delete", "resourceslices.resource.k8s.io",
                  f"--field-selector=spec.nodeName={node}", check=False)  # fmt: skip
    plane.kubectl("delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(node),
                  "--ignore-not-found")  # fmt: skip
