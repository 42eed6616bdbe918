"""An operator whose writes the API server refuses, on the real plane: here it runs
as the plane's admin, whom the chart's allocation-protection policy refuses every
VNPUAllocation create (only the operator's identity may). What an admin sees:
the pod's vnpu.io/Allocated condition and one Event saying why in the API
server's words, `kubectl vnpu why` saying the same, and the operator's log
carrying the policy's message, not only `403 Forbidden`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import Stack, get_json
from test_kubectl_vnpu import kubectl_vnpu

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.policies import NOT_THE_OPERATOR
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

NAMESPACE = "write-refused"
NODE = "wr-a"


@pytest.fixture(scope="module")
def stack(plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    plane.install_policies()
    stack = Stack(
        plane,
        Path(tmp_path_factory.mktemp("write-refused")),
        [NodeSpec(name=NODE, chips={"910B3": 1})],
        # The admin (system:masters): exempt from the pod policies, but not the operator
        # the allocation policy lets create VNPUAllocations.
        operator_extra=[f"--kubeconfig={plane.kubeconfig}"],
    ).start()
    plane.kubectl("create", "namespace", NAMESPACE, check=False)
    try:
        yield stack
    finally:
        stack.close()
        plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def _condition(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.POD_COND_ALLOCATED:
            return dict(condition)
    return None


def _events(plane: LocalPlane, uid: str, reason: str) -> list[dict[str, Any]]:
    items = get_json(
        plane, "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.uid={uid}"
    )["items"]
    return [e for e in items if e.get("reason") == reason]


def test_a_refused_write_is_told_on_the_pod_in_the_api_servers_words(
    plane: LocalPlane, stack: Stack
) -> None:
    plane.apply(vnpu_pod("refused", NAMESPACE))
    condition = wait_for(
        "the pod told its writes are refused",
        lambda: (
            (c := _condition(get_json(plane, "pod", "-n", NAMESPACE, "refused")))
            and c.get("reason") == names.REASON_WRITE_REFUSED
            and c
        ),
        timeout=60,
    )
    assert condition["status"] == "False"
    message = condition["message"]
    assert message.startswith(
        f"the API server refused to create its VNPUAllocation on node {NODE} (403 Forbidden: "
    ), message
    assert NOT_THE_OPERATOR in message, message
    pod = get_json(plane, "pod", "-n", NAMESPACE, "refused")
    assert pod["spec"].get("schedulingGates"), "the pod must stay gated"
    uid = pod["metadata"]["uid"]

    # Retried meanwhile (the backoff's ceiling is 2 s here), told once.
    time.sleep(5)
    (event,) = _events(plane, uid, names.REASON_WRITE_REFUSED)
    assert event["type"] == "Warning"
    assert event["message"] == message

    log = stack.operator.log_path.read_text().splitlines()
    assert any("403 Forbidden: " in line and NOT_THE_OPERATOR in line for line in log), (
        stack.operator.log_tail()
    )

    why = kubectl_vnpu(plane, "why", "refused", "-n", NAMESPACE)
    assert why.returncode == 0, why.stderr
    assert f"Condition:  {names.POD_COND_ALLOCATED}=False {names.REASON_WRITE_REFUSED}: " in (
        why.stdout
    )
    assert (
        f"Node {NODE} has room, but the operator's writes for this pod fail "
        f"({names.REASON_WRITE_REFUSED}): "
    ) in why.stdout, why.stdout
    assert NOT_THE_OPERATOR in why.stdout
