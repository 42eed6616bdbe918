"""An allocation as the agent reads it (vnpu_agent.allocation.AllocationView):
every field the agent's loops use comes from one parse of the raw watch
object, and a field that is absent or of the wrong type reads as absent
rather than failing the loop that reads it."""

from __future__ import annotations

from vnpu_agent.allocation import AllocationView


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
