"""A pod books exactly what its namespace was charged (DESIGN.md, invariants): a
template may take other resources on another chip model (vir04: 4096 MB on a 910,
12288 MB on a 310P3), and a pod admitted without vnpu.io/chip-model is charged the
size of the models offering it then. Placement reads the charge from the pod (the
webhook's vnpu.io/* requests, kept by the operator's slim copy) and books only vNPUs
of that size; the nodes it leaves out say why."""

from __future__ import annotations

from typing import Any

import pytest
from placement_helpers import GB, chip, node, nofit, placed, request

from localplane.pods import vnpu_pod
from vnpu_common.wire import names
from vnpu_common.wire.models import ChipStatus, TemplateResources
from vnpu_operator.placement import InvalidRequestError, Ledger, Placement, PodRequest, Reason
from vnpu_operator.placement.capacity import build_node_state, chip_obstacle
from vnpu_operator.placement.model import ChargedSize, Policy
from vnpu_operator.placement.nofit_memo import NoFitMemo
from vnpu_operator.slim import slim_pod

SMALL = ChargedSize(aicore=4, memory_mb=4 * GB)  # vir04 on a 910


def chip910(index: int = 0) -> ChipStatus:
    """A 910 chip (32 AICore, 32 GB, 14 AICPU) offering vir04 at 4 AICore, 4 GB."""
    vir04 = TemplateResources(name="vir04", aicore=4, memory_mb=4 * GB, aicpu=1, media=0)
    return chip("310P3", index, id_range=(100 + 16 * index, 115 + 16 * index)).model_copy(
        update={
            "model": "910", "templates": [vir04], "aicore_total": 32, "aicore_free": 32,
            "memory_total_mb": 32 * GB, "memory_free_mb": 32 * GB, "aicpu_total": 14,
            "aicpu_free": 14,
        }
    )  # fmt: skip


def charged(name: str, count: int = 1, each: ChargedSize | None = SMALL) -> PodRequest:
    plain = request(name, "vir04", count)
    return PodRequest(**{**_fields(plain), "charged": each})


def _fields(r: PodRequest) -> dict[str, Any]:
    return {
        "namespace": r.namespace, "name": r.name, "uid": r.uid, "template": r.template,
        "count": r.count, "chip_model": r.chip_model, "node_selector": r.node_selector,
        "required_affinity": r.required_affinity, "tolerations": r.tolerations,
    }  # fmt: skip


def admitted(count: int, **requests: str) -> dict[str, Any]:
    """A pod as the webhook admitted it, its charge in one container's requests."""
    p = vnpu_pod("p", "ns", uid="u", template="vir04", count=count, containers=["a", "b"])
    if requests:
        wanted = {f"{names.RESOURCE_PREFIX}{k.replace('_', '-')}": v for k, v in requests.items()}
        p["spec"]["containers"][1]["resources"] = {"requests": wanted, "limits": wanted}
    return p


# ------------------------------------------------------------------ reading the charge


def test_the_charge_is_read_from_the_pod_and_from_the_operators_slim_copy_alike() -> None:
    pod = admitted(2, aicore="8", memory_mb="8192", vnpus="2")
    full, slim = PodRequest.from_pod(pod), PodRequest.from_pod(slim_pod(pod))
    assert full.charged == slim.charged == ChargedSize(aicore=4, memory_mb=4096)
    assert full == slim


def test_a_pod_charged_nothing_has_no_charge_to_match() -> None:
    assert PodRequest.from_pod(admitted(1)).charged is None
    assert PodRequest.from_pod(slim_pod(admitted(1))).charged is None


def test_quantities_are_read_as_the_api_server_writes_them() -> None:
    pod = admitted(1, aicore="4", memory_mb="4Ki")
    assert PodRequest.from_pod(pod).charged == ChargedSize(aicore=4, memory_mb=4096)


def test_a_charge_that_is_not_count_times_a_size_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequestError, match=r"vnpu.io/memory-mb: 4097 is not 2 times"):
        PodRequest.from_pod(admitted(2, aicore="8", memory_mb="4097"))


# ------------------------------------------------------------------ the placement filter


def test_a_chip_offering_the_template_at_another_size_is_not_for_the_pod() -> None:
    p310 = node("p310", [chip("310P3", 0)])
    state = build_node_state(p310, [], {})
    obstacle = chip_obstacle(state.chips[0], "vir04", None, state.used_ids, SMALL)
    assert obstacle is Reason.CHARGED_SIZE
    assert chip_obstacle(state.chips[0], "vir04", None, state.used_ids) is None
    big = ChargedSize(aicore=4, memory_mb=12 * GB)
    assert chip_obstacle(state.chips[0], "vir04", None, state.used_ids, big) is None


def test_a_node_of_another_size_waits_the_pod_with_its_charge_in_the_message() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("p310", [chip("310P3", 0)]))
    result = nofit(ledger.place(charged("a")))
    assert result.node_reasons == {"p310": Reason.CHARGED_SIZE}
    assert result.primary_reason is Reason.CHARGED_SIZE
    assert result.message.startswith(
        "0/1 nodes can host 1 x vir04: 1 template size differs from the pod's quota charge"
    )
    assert "charged 4 AICore, 4096 MB a vNPU at admission" in result.message
    assert "vnpu.io/chip-model" in result.message
    # A node of its size joins: placed there, and only there.
    ledger.upsert_node(node("m910", [chip910()]))
    assert placed(ledger.place(charged("a"))).node == "m910"


def test_a_full_node_of_its_size_keeps_the_pod_waiting_beside_a_free_one_of_another() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("m910", [chip910()]))
    for i in range(8):  # 8 x 4 AICore fill the 910's 32
        assert placed(ledger.place(charged(f"fill{i}"))).node == "m910"
    ledger.upsert_node(node("p310", [chip("310P3", 0)]))
    result = nofit(ledger.place(charged("late")))
    assert result.node_reasons == {
        "m910": Reason.INSUFFICIENT_AICORE,
        "p310": Reason.CHARGED_SIZE,
    }
    assert ledger.allocations_on("p310") == []


def test_a_pod_charged_for_the_bigger_size_goes_where_it_is_that_size() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("m910", [chip910()]))
    ledger.upsert_node(node("p310", [chip("310P3", 0)]))
    big = charged("big", each=ChargedSize(aicore=4, memory_mb=12 * GB))
    assert placed(ledger.place(big)).node == "p310"


def test_an_uncharged_pod_goes_anywhere_the_template_fits() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("p310", [chip("310P3", 0)]))
    assert placed(ledger.place(charged("old", each=None))).node == "p310"


@pytest.mark.parametrize("first", ["uncharged", "charged"])
def test_cached_answers_never_mix_charged_and_uncharged_requests(first: str) -> None:
    """The per-shape candidate index, the per-node fits and the no-fit memo
    all key on the charge: whichever asks first, the other gets its own answer."""
    ledger = Ledger()
    ledger.upsert_node(node("p310", [chip("310P3", 0)]))
    memo = NoFitMemo()

    def place(r: PodRequest) -> Placement | Any:
        return memo.place(ledger, r, Policy.BINPACK, avoid=frozenset(), first_index=0)

    order = ["uncharged", "charged"] if first == "uncharged" else ["charged", "uncharged"]
    for which in order:
        if which == "uncharged":
            assert placed(place(charged("u", each=None))).node == "p310"
        else:
            assert nofit(place(charged("c"))).node_reasons == {"p310": Reason.CHARGED_SIZE}
    assert {a.pod_uid for a in ledger.allocations()} == {"uid-u"}
