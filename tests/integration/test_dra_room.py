"""A 310P3 DRA node's pool on the real API server (docs/DRA.md, "What the agent publishes"):
the room devices a chip publishes beside its largest template (a vir04 leaves 3 of 7 AICPUs)
are accepted by the API server's validation as published, listed before the chips' own
devices, and consume the set's room-* counters as well as the chip's own. 1.36+ only (the
main lane): 1.34 drops the fields of partitionable devices."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import add_node
from test_dra_slices import complete

from localplane import LocalPlane
from localplane.components import AgentProcess
from vnpu_common.wire import names

pytestmark = pytest.mark.plane


@pytest.fixture
def node(plane: LocalPlane) -> Iterator[str]:
    name = add_node(plane, "dras-room-310p", {"310P3": 2})
    yield name
    plane.kubectl("delete", names.NODE_PLURAL, name, "--wait=false", check=False)
    plane.kubectl("delete", "node", name, "--wait=false", check=False)
    plane.kubectl(
        "delete", "resourceslices", "--field-selector", f"spec.nodeName={name}", check=False
    )


def test_room_devices_are_accepted_and_listed_first(
    plane: LocalPlane, node: str, tmp_path: Path
) -> None:
    agent = AgentProcess(plane, tmp_path, [node], extra=["--dra=true"]).start()
    try:
        slices = complete(plane, node, 1, agent)
    finally:
        agent.kill(signal.SIGTERM)
    counters = [s for s in slices if s["spec"].get("sharedCounters")]
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    # The server kept every room counter the agent wrote.
    (counter_slice,) = counters
    for counter_set in counter_slice["spec"]["sharedCounters"]:
        assert any(k.startswith("room-") for k in counter_set["counters"]), counter_set
    # 20 devices per empty chip and 8 room devices beside its vir04: 28 a chip.
    assert len(devices) == 2 * 28, [d["name"] for d in devices]
    room = [
        d
        for d in devices
        if any(k.startswith("room-") for c in d["consumesCounters"] for k in c["counters"])
    ]
    assert len(room) == 2 * 8
    # Listed first: the scheduler's first fit takes them before a chip's own.
    assert devices[: len(room)] == room
    for d in room:
        (consumed,) = d["consumesCounters"]
        assert names.DRA_COUNTER_VNPUS in consumed["counters"]  # the chip's own, as well
        assert d["attributes"][names.DRA_ATTR_TEMPLATE]["string"] != "vir04"
