"""Cordon a chip, on the real plane with the real agent and operator: a chip an
admin cordons (VNPUNode spec.cordonedChips, a plain kubectl patch) or one the
driver reports unhealthy gets no new vNPU while the node's other chip still
does; vNPUs already on it stay; uncordon (or recovery) lets a waiting pod in.
Who may write the cordon: tests/integration/test_chart_release.py
(test_only_admins_cordon_chips)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_harness import Stack, StackOf, get_json, pod_allocations, pod_running, pod_waiting
from prometheus_client.parser import text_string_to_metric_families

from localplane import LocalPlane, NodeSpec
from localplane.components import vnpu_ids
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

CORDON, SICK = "cordon-a", "cordon-b"
LABEL = "cordon-test"
TEMPLATE = "vir05_1c_16g"  # four fill a 910B3 chip
PER_CHIP = 4


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name=n, chips={"910B3": 2}, labels={LABEL: n}) for n in (CORDON, SICK)],
    )


def pod_on(namespace: str, name: str, node: str) -> dict[str, Any]:
    return vnpu_pod(name, namespace, template=TEMPLATE, node_selector={LABEL: node})


def chip_of(plane: LocalPlane, pod: dict[str, Any]) -> int:
    meta = pod["metadata"]
    (alloc,) = pod_allocations(plane, meta["namespace"], meta["uid"])
    assert alloc["status"]["phase"] == names.PHASE_READY
    return int(alloc["spec"]["chip"])


def unavailable(stack: Stack, node: str) -> dict[tuple[str, str], float]:
    """(chip, reason) -> value of vnpu_operator_chip_unavailable for `node`."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(stack.operator.metrics()):
        if family.name != "vnpu_operator_chip_unavailable":
            continue
        for s in family.samples:
            if s.labels["node"] == node:
                out[(s.labels["chip"], s.labels["reason"])] = s.value
    return out


def columns(plane: LocalPlane, node: str) -> dict[str, str]:
    """`kubectl get vnpunodes NODE` as header -> cell."""
    header, row = plane.kubectl("get", names.NODE_PLURAL, node).stdout.splitlines()
    # Cells are aligned under their header: cut the row at the headers' offsets.
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def column_shows(plane: LocalPlane, node: str, column: str, value: str) -> None:
    """The agent echoes the cordon into the status a moment after the patch."""
    wait_for(
        f"kubectl get {node}: {column} {value}",
        lambda: columns(plane, node)[column] == value,
        timeout=30,
        interval=0.3,
    )


def cordon(plane: LocalPlane, node: str, chips: dict[int, str]) -> None:
    """What docs/USAGE.md's "Cordon a chip" tells admins to run."""
    body = {"spec": {"cordonedChips": [{"chip": c, "reason": r} for c, r in chips.items()]}}
    plane.kubectl("patch", names.NODE_PLURAL, node, "--type=merge", "-p", json.dumps(body))


def uncordon_all(plane: LocalPlane, node: str) -> None:
    body = '{"spec":{"cordonedChips":null}}'
    plane.kubectl("patch", names.NODE_PLURAL, node, "--type=merge", "-p", body)


def fill_other_chip(
    plane: LocalPlane, namespace: str, node: str, spared: int, n: int = PER_CHIP
) -> None:
    """`n` new pods, each on the chip that is not `spared`."""
    for i in range(n):
        plane.apply(pod_on(namespace, f"fill-{i}", node))
    for i in range(n):
        assert chip_of(plane, pod_running(plane, namespace, f"fill-{i}")) == 1 - spared


def test_cordoned_chip_gets_nothing_new_and_uncordon_wakes_a_waiting_pod(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    plane.apply(pod_on(namespace, "before", CORDON))
    before = pod_running(plane, namespace, "before")
    chip = chip_of(plane, before)
    vnpu_before = vnpu_ids(stack.agent.sim(CORDON))

    # kubectl get shows every cordoned chip.
    cordon(plane, CORDON, {0: "fan failure", 1: "fan failure"})
    column_shows(plane, CORDON, "CORDONED", "0,1")
    cordon(plane, CORDON, {chip: "fan failure"})
    column_shows(plane, CORDON, "CORDONED", str(chip))
    wait_for(
        "operator sees the cordon",
        lambda: unavailable(stack, CORDON) == {(str(chip), "cordoned"): 1.0},
        timeout=30,
        interval=0.3,
    )

    # The other chip still takes new vNPUs, up to full; the cordoned one takes none.
    fill_other_chip(plane, namespace, CORDON, spared=chip)
    plane.apply(pod_on(namespace, "waiter", CORDON))
    cond = pod_waiting(plane, namespace, "waiter")
    assert cond["reason"] == names.REASON_WAITING
    # Its own chip is full; uncordoning the other is what would let it in.
    assert "1 chip cordoned" in cond["message"], cond

    # What was on the cordoned chip is untouched.
    again = get_json(plane, "pod", "-n", namespace, "before")
    assert again["metadata"]["uid"] == before["metadata"]["uid"]
    assert again["status"]["phase"] == "Running"
    assert chip_of(plane, again) == chip
    assert vnpu_before.items() <= vnpu_ids(stack.agent.sim(CORDON)).items()

    uncordon_all(plane, CORDON)
    assert chip_of(plane, pod_running(plane, namespace, "waiter")) == chip
    column_shows(plane, CORDON, "CORDONED", "")
    wait_for("operator sees the uncordon", lambda: unavailable(stack, CORDON) == {}, timeout=30)


def node_events(plane: LocalPlane, node: str, reason: str) -> list[dict[str, Any]]:
    listed = get_json(
        plane, "events", "-n", "default", "--field-selector",
        f"involvedObject.kind={names.NODE_KIND},involvedObject.name={node},reason={reason}",
    )  # fmt: skip
    return list(listed["items"])


def chips_healthy(plane: LocalPlane, node: str) -> dict[str, Any] | None:
    obj = get_json(plane, names.NODE_PLURAL, node) or {}
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == names.COND_CHIPS_HEALTHY:
            return dict(cond)
    return None


def test_an_unhealthy_chip_is_avoided_and_recovers(
    stack: Stack, plane: LocalPlane, namespace: str
) -> None:
    sim = stack.agent.sim(SICK)
    plane.apply(pod_on(namespace, "before", SICK))
    before = pod_running(plane, namespace, "before")
    chip = chip_of(plane, before)

    sim.set_chip_health(chip, False)
    cond = wait_for(
        "ChipsHealthy=False",
        lambda: (c := chips_healthy(plane, SICK)) and c["status"] == "False" and c,
        timeout=30,
        interval=0.3,
    )
    assert cond["reason"] == names.REASON_CHIP_UNHEALTHY
    assert f"unhealthy chips: {chip};" in cond["message"]
    (event,) = wait_for(
        "ChipUnhealthy Event", lambda: node_events(plane, SICK, names.REASON_CHIP_UNHEALTHY)
    )
    assert event["type"] == "Warning"
    assert f"chip {chip} of {SICK} is unhealthy" in event["message"]
    column_shows(plane, SICK, "UNHEALTHY", str(chip))
    wait_for(
        "operator sees the unhealthy chip",
        lambda: unavailable(stack, SICK) == {(str(chip), "unhealthy"): 1.0},
        timeout=30,
        interval=0.3,
    )

    fill_other_chip(plane, namespace, SICK, spared=chip)
    plane.apply(pod_on(namespace, "waiter", SICK))
    cond = pod_waiting(plane, namespace, "waiter")
    assert cond["reason"] == names.REASON_WAITING
    # An unhealthy chip is checked before capacity: the node names its full chip.
    assert "1 insufficient AICore" in cond["message"], cond
    # The vNPU on the sick chip stays; its allocation says the chip is unhealthy.
    again = get_json(plane, "pod", "-n", namespace, "before")
    assert again["metadata"]["uid"] == before["metadata"]["uid"]
    assert again["status"]["phase"] == "Running"

    sim.set_chip_health(chip, True)
    assert chip_of(plane, pod_running(plane, namespace, "waiter")) == chip
    wait_for(
        "ChipsHealthy=True",
        lambda: (c := chips_healthy(plane, SICK)) and c["status"] == "True",
        timeout=30,
    )
    (healthy,) = wait_for(
        "ChipHealthy Event", lambda: node_events(plane, SICK, names.REASON_CHIP_HEALTHY)
    )
    assert f"chip {chip} of {SICK} is healthy again" in healthy["message"]
    assert unavailable(stack, SICK) == {}
