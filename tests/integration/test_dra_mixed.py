"""One ledger, two front-ends (docs/DRA.md, "Why one mode per node"): a churn
of annotated pods and pods with ResourceClaims on one cluster never books a
chip twice, never puts a pod of one kind on a node of the other, and leaves
no allocation and no vNPU behind.

Node layout (prefix `mix-`): mix-plain-a, mix-plain-b (annotation nodes, the
Stack's agent) and mix-dra-a, mix-dra-b (DRA nodes, an agent of their own
with --dra); one 910B3 each: 4 x vir05_1c_16g a chip.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dra_harness import claim_pod, claim_template, device_class
from operator_harness import Stack, StackOf, get_json
from test_dra_claims import node_vnpus

from localplane import LocalPlane, NodeSpec
from localplane.components import AgentProcess
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for

pytestmark = pytest.mark.plane

PLAIN = ("mix-plain-a", "mix-plain-b")
DRA = ("mix-dra-a", "mix-dra-b")
SMALL = "vir05_1c_16g"
ROUNDS, PER_ROUND = 4, 6


@pytest.fixture(scope="module")
def stack(stack_of: StackOf, plane: LocalPlane) -> Stack:
    plane.apply(device_class())
    return stack_of([NodeSpec(name=n, chips={"910B3": 1}) for n in PLAIN])


@pytest.fixture(scope="module")
def dra_agent(
    stack: Stack, plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    plane.add_nodes([NodeSpec(name=n, chips={"910B3": 1}) for n in DRA])
    agent = AgentProcess(
        plane, Path(tmp_path_factory.mktemp("dra-agent")), list(DRA), extra=["--dra", "true"]
    ).start()
    wait_for("DRA VNPUNodes", lambda: all(get_json(plane, "vnpunode", n) for n in DRA))
    yield agent
    agent.kill()
    for node in DRA:
        plane.kubectl("delete", "node", node, "--wait=false", check=False)
        plane.kubectl("delete", "vnpunode", node, "--wait=false", check=False)


def allocations(plane: LocalPlane, namespace: str) -> list[dict[str, Any]]:
    return list((get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items", []))


def check_books(plane: LocalPlane, namespace: str) -> int:
    """The invariants at one moment; returns how many allocations there are."""
    allocs = allocations(plane, namespace)
    ids = Counter((a["spec"]["nodeName"], a["spec"]["vnpuId"]) for a in allocs)
    assert all(n == 1 for n in ids.values()), f"vNPU id booked twice: {ids}"
    for a in allocs:
        node, claim = a["spec"]["nodeName"], a["spec"].get("claim")
        if claim:
            assert node in DRA, f"claim allocation {a['metadata']['name']} on {node}"
        else:
            assert node in PLAIN, f"annotated pod's allocation {a['metadata']['name']} on {node}"
    return len(allocs)


def test_a_churn_of_both_kinds_never_books_a_chip_twice_and_leaves_nothing(
    stack: Stack, dra_agent: AgentProcess, plane: LocalPlane, namespace: str
) -> None:
    rng = random.Random(34)
    plane.apply(claim_template(namespace, "small", SMALL))
    live: list[tuple[str, str]] = []  # (kind, name)
    seen_max = 0
    for r in range(ROUNDS):
        for i in range(PER_ROUND):
            name = f"r{r}-{i}"
            if rng.random() < 0.5:
                plane.apply(vnpu_pod(f"ann-{name}", namespace, template=SMALL))
                live.append(("ann", f"ann-{name}"))
            else:
                plane.apply(claim_pod(namespace, f"dra-{name}", "small"))
                live.append(("dra", f"dra-{name}"))
        # Let placements and bindings happen while checking the books.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            seen_max = max(seen_max, check_books(plane, namespace))
            time.sleep(0.5)
        # Delete half of what runs, at random.
        rng.shuffle(live)
        going, live = live[: len(live) // 2], live[len(live) // 2 :]
        for _, name in going:
            plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
        seen_max = max(seen_max, check_books(plane, namespace))
    assert seen_max >= 8, "the churn never filled the nodes (too gentle to prove anything)"
    kinds = Counter(k for k, _ in live)
    assert set(kinds) <= {"ann", "dra"}
    for _, name in live:
        plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
    wait_for("every allocation released", lambda: not allocations(plane, namespace), timeout=120)
    wait_for(
        "every vNPU destroyed",
        lambda: all(not node_vnpus(plane, n) for n in (*PLAIN, *DRA)),
        timeout=60,
    )
    wait_for(
        "every pod gone",
        lambda: not (get_json(plane, "pods", "-n", namespace) or {}).get("items"),
        timeout=60,
    )
