"""`kubectl vnpu defrag` on the real plane: an operator running spread
scatters two small vNPUs over two nodes' chips; the advisor suggests one
move, which needs the operator's pin to the pod's node taken off; the
command writes nothing; applying the move as the docs say (cordon the chip,
delete the pod, create it again, uncordon) frees the chip it promised, and
exactly the promised number of the largest template can then be placed."""

from __future__ import annotations

import json

import pytest
from operator_harness import Stack, StackOf, audit_since, get_json, pod_running
from test_kubectl_vnpu import kubectl_vnpu, pod_json

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

NODES = ("df-a", "df-b")
SMALL, LARGEST = "vir05_1c_16g", "vir10_3c_32g"


@pytest.fixture
def stack(stack_of_test: StackOf) -> Stack:
    """Two nodes of one 910B3 chip each; the operator spreads."""
    return stack_of_test(
        [NodeSpec(name=n, chips={"910B3": 1}) for n in NODES], operator_extra=["--policy=spread"]
    )


def held(plane: LocalPlane, namespace: str) -> dict[str, tuple[str, int]]:
    """Pod name -> (node, chip) of its one vNPU, from the allocations."""
    items = get_json(plane, "vnpuallocations", "-n", namespace)["items"]
    return {a["spec"]["podName"]: (a["spec"]["nodeName"], a["spec"]["chip"]) for a in items}


def writes_by_others(plane: LocalPlane, offset: int) -> list[str]:
    """Creates, deletes, evictions and spec changes of pods, allocations and
    VNPUNodes since `offset`, by anyone."""
    out = []
    for event in audit_since(plane, offset):
        ref = event.get("objectRef") or {}
        if ref.get("resource") not in ("pods", "vnpuallocations", "vnpunodes"):
            continue
        if ref.get("subresource") == "status" or event.get("verb") in ("get", "list", "watch"):
            continue
        out.append(f"{event.get('verb')} {ref.get('resource')}/{ref.get('subresource', '')}")
    return out


def test_the_suggestion_applied_frees_the_chip_and_fits_what_it_promised(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    # Spread: the first pod goes to df-a, the second to the emptier df-b.
    for name in ("p0", "p1"):
        plane.apply(vnpu_pod(name, namespace, template=SMALL))
        pod_running(plane, namespace, name)
    assert sorted(held(plane, namespace).values()) == [("df-a", 0), ("df-b", 0)]
    uids = {n: pod_running(plane, namespace, n)["metadata"]["uid"] for n in ("p0", "p1")}

    offset = plane.audit_log.stat().st_size
    out = kubectl_vnpu(plane, "defrag", "-o", "json", "--policy", "spread")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    text = kubectl_vnpu(plane, "defrag", "--policy", "spread")
    assert text.returncode == 0, text.stderr
    assert "Nothing was evicted or moved" in text.stdout

    assert report["evicted"] == 0
    assert report["largestTemplates"] == {"910B3": LARGEST}
    assert report["largestFits"] == {
        "before": {"910B3": 2},
        "after": {"910B3": 3},
        "limit": {"910B3": 3},
    }
    [step] = report["steps"]
    [move] = step["pods"]
    moved = move["pod"].split("/")[1]
    source = (step["node"], step["chip"])
    assert (move["from"]["node"], move["from"]["chips"]) == (source[0], [source[1]])
    # Pinned by the operator to its node, the pod may still go to the other.
    assert move["to"]["node"] != source[0]
    assert step["wholeChips"] == [{"node": source[0], "chip": source[1]}]

    # The command changed nothing: same pods, same vNPUs, no writes.
    assert {n: pod_running(plane, namespace, n)["metadata"]["uid"] for n in uids} == uids
    assert sorted(held(plane, namespace).values()) == [("df-a", 0), ("df-b", 0)]
    assert writes_by_others(plane, offset) == []

    # Applied as the docs say.
    cordon = kubectl_vnpu(plane, "cordon", source[0], str(source[1]), "--reason", "defrag")
    assert cordon.returncode == 0, cordon.stderr
    try:
        # Waits for the finalizer: the vNPU is destroyed when it returns.
        plane.kubectl("delete", "pod", "-n", namespace, moved, "--timeout=60s")
        plane.apply(vnpu_pod(moved, namespace, template=SMALL))
        pod_running(plane, namespace, moved)
        assert held(plane, namespace)[moved] == (move["to"]["node"], move["to"]["chips"][0])
    finally:
        uncordon = kubectl_vnpu(plane, "uncordon", source[0], str(source[1]))
    assert uncordon.returncode == 0, uncordon.stderr
    assert source not in held(plane, namespace).values()
    status = json.loads(kubectl_vnpu(plane, "status", "-o", "json").stdout)
    chips = {(n["name"], c["index"]): c for n in status["nodes"] for c in n["chips"]}
    assert chips[source]["aicore"]["used"] == 0
    assert chips[source]["vnpus"] == []

    # As many of the largest template as promised fit now, and no more.
    promised = report["largestFits"]["after"]["910B3"]
    for i in range(promised):
        plane.apply(vnpu_pod(f"big{i}", namespace, template=LARGEST))
    for i in range(promised):
        pod_running(plane, namespace, f"big{i}")
    plane.apply(vnpu_pod("one-more", namespace, template=LARGEST))
    wait_for(
        "one-more told it waits",
        lambda: any(
            c.get("type") == names.POD_COND_ALLOCATED and c.get("reason") == names.REASON_WAITING
            for c in ((pod_json(plane, namespace, "one-more") or {}).get("status") or {}).get(
                "conditions"
            )
            or []
        ),
        timeout=60,
    )
    after = json.loads(kubectl_vnpu(plane, "defrag", "-o", "json").stdout)
    assert after["largestFits"]["before"] == {"910B3": 0}
    assert after["steps"] == []
