"""Capacity the scheduler cannot see, on the real control plane (issue 54,
items 3 and 5): a foreign vNPU fills dra-pf-a's chip, so the agent publishes
that chip's counters net of it and the scheduler never allocates a device
there: claim pods go to dra-pf-b, and once it is full the next one waits in
Pending quietly, with no claim ever allocated on dra-pf-a and no failed
create. Then an admin cordons dra-pf-b's chip: a pod tolerating every taint
(`tolerations: [{operator: Exists}]`, as the harness' claim pods do) still
gets no device there.

Node layout (prefix `dra-pf-`): a and b, one 910B3 each (4 x vir05_1c_16g or
2 x vir10_3c_32g), served by one agent with --dra. Unit tests of the same:
tests/unit/agent/test_dra_pool_net.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dra_harness import claim_pod, claim_template, device_class
from operator_harness import Stack, StackOf, get_json

from localplane import LocalPlane, NodeSpec
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

FULL, FREE = "dra-pf-a", "dra-pf-b"
SMALL = "vir05_1c_16g"


@pytest.fixture(scope="module")
def stack(stack_of: StackOf, plane: LocalPlane) -> Stack:
    plane.apply(device_class())
    return stack_of(
        [NodeSpec(name=n, chips={"910B3": 1}) for n in (FULL, FREE)], agent_extra=["--dra", "true"]
    )


def counters(plane: LocalPlane, node: str) -> dict[str, str] | None:
    got = get_json(plane, "resourceslices", "--field-selector", f"spec.nodeName={node}") or {}
    for s in got.get("items") or []:
        for cs in s["spec"].get("sharedCounters") or []:
            if cs["name"] == "npu-0":
                return {k: v["value"] for k, v in cs["counters"].items()}
    return None


class ClaimWatch:
    """Every (pool, device) any claim of the namespace was allocated, polled
    in a thread for the whole test: an allocation undone within a second (a
    refusal, a failed create) still shows."""

    def __init__(self, plane: LocalPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.seen: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = get_json(self.plane, "resourceclaims", "-n", self.namespace) or {}
            for c in got.get("items") or []:
                alloc = (c.get("status") or {}).get("allocation") or {}
                for r in (alloc.get("devices") or {}).get("results") or []:
                    self.seen.add((r["pool"], r["device"]))
            self._stop.wait(0.2)

    def __enter__(self) -> ClaimWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def bound(plane: LocalPlane, namespace: str, pod: str) -> str | None:
    p = get_json(plane, "pod", "-n", namespace, pod) or {}
    node = (p.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def failed_allocations(plane: LocalPlane, namespace: str) -> list[dict[str, Any]]:
    items = (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items") or []
    return [a for a in items if (a.get("status") or {}).get("phase") == names.PHASE_FAILED]


@pytest.fixture
def foreign(stack: Stack, plane: LocalPlane) -> Iterator[None]:
    """dra-pf-a's chip filled by two vir10_3c_32g made by hand (the default
    policy keeps foreign vNPUs), and the pool net of them."""
    sim = stack.agent.sim(FULL)
    for vnpu_id in (110, 111):
        sim.create_vnpu(0, "vir10_3c_32g", vnpu_id)
    wait_for(
        "dra-pf-a's counters net of the foreign vNPUs",
        lambda: (c := counters(plane, FULL)) is not None and c["aicore"] == "0",
        timeout=30,
    )
    yield
    for vnpu_id in (110, 111):
        sim.destroy_vnpu(0, vnpu_id)


def test_a_chip_full_of_foreign_vnpus_is_never_chosen(
    stack: Stack, plane: LocalPlane, namespace: str, foreign: None
) -> None:
    """Fails before issue 54: the counters described an empty chip, so the
    scheduler allocated dra-pf-a's devices and every create there failed."""
    assert counters(plane, FREE) == {
        "aicore": "20", "memory-mb": "65536", "aicpu": "7", "media": "9", "vnpus": "16",
    }  # fmt: skip
    plane.apply(claim_template(namespace, "small", SMALL))
    pods = [f"small-{i}" for i in range(5)]
    with ClaimWatch(plane, namespace) as watch:
        for name in pods:
            plane.apply(claim_pod(namespace, name, "small"))

        def four_bound() -> int | None:
            n = sum(1 for p in pods if bound(plane, namespace, p))
            return n if n == 4 else None

        wait_for("four pods bound", four_bound, timeout=120)
        # The fifth has nowhere to go: it waits, and nothing loops meanwhile.
        time.sleep(8)
        placed = {p: bound(plane, namespace, p) for p in pods}
    assert sorted(n for n in placed.values() if n) == [FREE] * 4, placed
    assert not [pool for pool, _ in watch.seen if pool == FULL], watch.seen
    assert len({d for pool, d in watch.seen if pool == FREE}) == 4
    assert failed_allocations(plane, namespace) == []
    waiting = next(p for p, n in placed.items() if n is None)
    pod = get_json(plane, "pod", "-n", namespace, waiting) or {}
    assert (pod.get("status") or {}).get("phase") == "Pending"
    for name in pods:
        plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)
    wait_for(
        "every allocation released",
        lambda: not (get_json(plane, "vnpuallocations", "-n", namespace) or {}).get("items"),
        timeout=90,
    )


def test_a_cordoned_chip_gets_no_claim_whatever_it_tolerates(
    stack: Stack, plane: LocalPlane, namespace: str, foreign: None
) -> None:
    """Fails before issue 54: a cordon was a NoSchedule device taint, which
    the pod's `tolerations: [{operator: Exists}]` defeats."""
    patch = json.dumps({"spec": {"cordonedChips": [{"chip": 0, "reason": "pool test"}]}})
    plane.kubectl("patch", names.NODE_PLURAL, FREE, "--type=merge", "-p", patch)
    try:
        wait_for(
            "dra-pf-b offers no device",
            lambda: (
                not [
                    d
                    for s in (
                        get_json(
                            plane, "resourceslices", "--field-selector", f"spec.nodeName={FREE}"
                        )
                        or {}
                    ).get("items")
                    or []
                    for d in s["spec"].get("devices") or []
                ]
            ),
            timeout=30,
        )
        plane.apply(claim_template(namespace, "small", SMALL))
        pod = claim_pod(namespace, "tolerant", "small")
        assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]
        with ClaimWatch(plane, namespace) as watch:
            plane.apply(pod)
            time.sleep(8)
        assert bound(plane, namespace, "tolerant") is None
        assert watch.seen == set()
        assert failed_allocations(plane, namespace) == []
    finally:
        plane.kubectl(
            "patch", names.NODE_PLURAL, FREE, "--type=merge", "-p", '{"spec":{"cordonedChips":[]}}'
        )
        plane.kubectl("delete", "pod", "-n", namespace, "tolerant", "--wait=false", check=False)
