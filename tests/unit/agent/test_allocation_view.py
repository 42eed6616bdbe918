"""An allocation as the agent reads it (vnpu_agent.allocation.AllocationView):
every field the agent's loops use comes from one parse of the raw watch
object, and a field that is absent or of the wrong type reads as absent
rather than failing the loop that reads it."""

from __future__ import annotations

from typing import Any

import pytest

from vnpu_agent.allocation import (
    AllocationView,
    chip_of,
    is_deleting,
    owner_of,
    phase_of,
    vnpu_id_of,
)


def test_a_dra_allocation_reads_fully() -> None:
    a = AllocationView.of(
        {
            "metadata": {"namespace": "ns", "name": "a1", "deletionTimestamp": "2026-12-03T07:00Z"},
            "spec": {
                "nodeName": "n1", "vnpuId": 105, "chip": 1, "template": "vir05_1c_16g",
                "podName": "p", "podUID": "u-p", "claim": {"uid": "u-c", "name": "c"},
            },
            "status": {"phase": "Releasing"},
        }
    )  # fmt: skip
    assert a == AllocationView(
        namespace="ns", name="a1", node="n1", id=105, chip=1, template="vir05_1c_16g",
        pod="p", pod_uid="u-p", claim_uid="u-c", dra=True, phase="Releasing", deleting=True,
    )  # fmt: skip
    assert a.key == "ns/a1"


def test_missing_or_mistyped_fields_read_as_absent() -> None:
    bare = AllocationView.of({})
    assert (bare.id, bare.chip, bare.node, bare.claim_uid, bare.phase) == (None,) * 5
    assert (bare.template, bare.pod, bare.dra, bare.deleting) == ("", "", False, False)
    odd = AllocationView.of(
        {"metadata": None, "spec": {"vnpuId": "105", "chip": None, "claim": {}}, "status": None}
    )
    assert (odd.id, odd.chip, odd.dra, odd.phase) == (None, None, False, None)


# Shapes a field reader could read otherwise than the view: sections absent,
# null or of the wrong type, ids that are not ints (a bool is one to both).
ODD: list[dict[str, Any]] = [
    {},
    {"metadata": None, "spec": None, "status": None},
    {"metadata": {"namespace": "ns"}, "spec": {"vnpuId": 105, "chip": 2}},
    {"metadata": {"name": "a"}, "spec": {"vnpuId": "105", "chip": "2", "podUID": "u"}},
    {"spec": {"vnpuId": True, "chip": 0}, "status": {"phase": "Ready"}},
    {"metadata": {"deletionTimestamp": ""}, "spec": {"vnpuId": 0}},
    {"metadata": {"namespace": "ns", "name": "a", "deletionTimestamp": "t"},
     "spec": {"vnpuId": 105, "podUID": None}, "status": {"phase": 3}},
]  # fmt: skip


@pytest.mark.parametrize("obj", ODD)
def test_the_field_readers_read_what_the_view_reads(obj: dict[str, Any]) -> None:
    """The loops over every allocation read single fields (allocation.py):
    each must say what the whole view says."""
    a = AllocationView.of(obj)
    assert (vnpu_id_of(obj), chip_of(obj), phase_of(obj), is_deleting(obj)) == (
        a.id,
        a.chip,
        a.phase,
        a.deleting,
    )
    assert owner_of(obj) == (None if a.id is None else (a.id, a.key, a.pod_uid))
