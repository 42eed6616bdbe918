"""A dead agent's DRA node on the real control plane (issue 54, item 6): the
claim the scheduler gave it goes back at once (the operator fails the
device's binding instead of leaving the pod in PreBind for the scheduler's
10-minute timeout), and the node's ResourceSlices are deleted by the operator
(kwok nodes have no kubelet to do it), so the scheduler stops choosing the
node; once the agent is back it publishes its pool again and the pod binds.

Node layout (prefix `drl-`): drl-a, one 910B3, served by the stack's agent;
drl-x, one 910B3, served by an agent of its own with a 5 s Lease, killed by
the test. Both agents run with --dra.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dra_harness import claim_pod, claim_template, device_class
from operator_harness import Stack, get_json

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE, AgentProcess
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

LIVE = NodeSpec(name="drl-a", chips={"910B3": 1})
DYING = NodeSpec(name="drl-x", chips={"910B3": 1})
LEASE_SECONDS = 5
SMALL = "vir05_1c_16g"


@dataclass
class Env:
    stack: Stack
    dying: AgentProcess


@pytest.fixture(scope="module")
def env(plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    plane.apply(device_class())
    workdir = Path(tmp_path_factory.mktemp("dra-lease"))
    stack = Stack(
        plane,
        workdir / "stack",
        [LIVE],
        agent_extra=["--dra", "true"],
        operator_extra=["--lease-grace-seconds=1"],
    )
    plane.add_nodes([DYING])
    (workdir / "dying").mkdir()
    dying = AgentProcess(
        plane,
        workdir / "dying",
        [DYING.name],
        extra=["--dra", "true", f"--lease-duration-seconds={LEASE_SECONDS}"],
    )
    try:
        # The stack first: it clears VNPUNodes of nodes it does not serve.
        stack.start()
        dying.start()
        wait_for("drl-x's pool published", lambda: slices(plane, DYING.name), timeout=60)
        yield Env(stack, dying)
    finally:
        try:
            if dying.proc is None:
                # Its node's allocations are released only while it runs.
                with contextlib.suppress(Exception):
                    dying.start()
            stack.close()
        finally:
            dying.kill(signal.SIGTERM)
            plane.kubectl("delete", "node", DYING.name, "--wait=false", check=False)
            plane.kubectl("delete", "vnpunode", DYING.name, "--wait=false", check=False)
            plane.kubectl(
                "delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(DYING.name),
                "--wait=false", check=False,
            )  # fmt: skip


def slices(plane: LocalPlane, node: str) -> list[dict[str, Any]]:
    got = get_json(
        plane,
        "resourceslices",
        "--field-selector",
        f"spec.nodeName={node},spec.driver={names.DRA_DRIVER}",
    )
    return list((got or {}).get("items", []))


def metric(stack: Stack, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    line = next((x for x in stack.operator.metrics().splitlines() if x.startswith(prefix)), "")
    return float(line[len(prefix) :] or 0)


def pod_on(namespace: str, pod: str, node: str) -> dict[str, Any]:
    manifest = claim_pod(namespace, pod, "small")
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return manifest


def bound_node(plane: LocalPlane, namespace: str, pod: str) -> str | None:
    p = get_json(plane, "pod", "-n", namespace, pod) or {}
    node = (p.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def claims_on(plane: LocalPlane, namespace: str, node: str) -> list[dict[str, Any]]:
    """The namespace's claims allocated a device of `node`'s pool."""
    got = get_json(plane, "resourceclaims", "-n", namespace) or {}
    return [
        c
        for c in got.get("items", [])
        if any(
            r.get("pool") == node
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            )
            or []
        )
    ]


def test_an_expired_agent_lease_gives_the_claim_back_at_once_and_removes_the_pool(
    env: Env, plane: LocalPlane, namespace: str
) -> None:
    stack = env.stack
    plane.apply(claim_template(namespace, "small", SMALL))
    refused_before = metric(stack, "vnpu_operator_dra_claims_refused_total", 'reason="AgentDown"')
    deleted_before = metric(stack, "vnpu_operator_dra_slices_deleted_total")

    # The pool stays published after the kill until someone removes it: the
    # scheduler allocates drl-x's device to the claim, the operator books it,
    # and no agent will ever make the vNPU.
    env.dying.kill(signal.SIGKILL)
    killed = time.monotonic()
    plane.apply(pod_on(namespace, "only-x", DYING.name))

    def given_back() -> bool:
        refused = metric(stack, "vnpu_operator_dra_claims_refused_total", 'reason="AgentDown"')
        return refused > refused_before

    wait_for("the claim given back", given_back, timeout=60, interval=0.5)
    took = time.monotonic() - killed
    # The Lease runs out LEASE_SECONDS + 1 s after its last renewal; the binding
    # timeout the scheduler would otherwise wait for is 10 minutes.
    assert took < LEASE_SECONDS + 30, f"the claim went back {took:.0f}s after the agent died"
    wait_for("drl-x's pool removed", lambda: not slices(plane, DYING.name), timeout=30)
    assert metric(stack, "vnpu_operator_dra_slices_deleted_total") > deleted_before
    # With no pool the scheduler cannot give drl-x's devices again.
    wait_for(
        "no claim allocated on drl-x",
        lambda: not claims_on(plane, namespace, DYING.name),
        timeout=60,
        interval=0.5,
    )
    time.sleep(3)
    assert not claims_on(plane, namespace, DYING.name)
    assert bound_node(plane, namespace, "only-x") is None
    assert slices(plane, LIVE.name), "a live node's pool was removed"

    # Back: the agent publishes its pool again, and the pod binds there.
    env.dying.start()
    wait_for("drl-x's pool published again", lambda: slices(plane, DYING.name), timeout=60)
    wait_for("only-x bound", lambda: bound_node(plane, namespace, "only-x"), timeout=120)
    assert bound_node(plane, namespace, "only-x") == DYING.name
    plane.kubectl("delete", "pod", "-n", namespace, "only-x", "--wait=false")
    wait_for(
        "allocations released",
        lambda: not (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items"),
        timeout=90,
    )
