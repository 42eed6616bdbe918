"""validate_pod against what the cluster offers, and OfferedTemplates itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from vnpu_common.wire import names
from vnpu_common.wire.models import VNPUNodeStatus
from vnpu_operator.admission import OfferedTemplates, validate_pod
from vnpu_operator.admission.decisions import decide_mutation, decide_validation

PodFactory = Callable[..., dict[str, Any]]

OFFERED_910B3 = "910B3: vir05_1c_16g, vir10_3c_32g"
OFFERED_ALL = f"310P3: vir01, vir02, vir04; {OFFERED_910B3}"


def _chip(index: int, model: str, templates: list[str], health: str = "Healthy") -> dict[str, Any]:
    return {
        "index": index,
        "physicalId": index,
        "cardId": index,
        "deviceId": 0,
        "model": model,
        "health": health,
        "aicoreTotal": 20,
        "aicoreFree": 20,
        "memoryTotalMb": 65536,
        "memoryFreeMb": 65536,
        "aicpuTotal": 7,
        "aicpuFree": 7,
        "vnpuIdMin": 100,
        "vnpuIdMax": 115,
        "templates": [{"name": t, "aicore": 5, "memoryMb": 16384, "aicpu": 1} for t in templates],
    }


def test_offered_from_node_statuses_merges_chips_and_nodes() -> None:
    statuses = [
        VNPUNodeStatus.model_validate(
            {"chips": [_chip(0, "910B3", ["vir05_1c_16g"]), _chip(1, "310P3", ["vir01"])]}
        ),
        VNPUNodeStatus.model_validate(
            {"chips": [_chip(0, "910B3", ["vir10_3c_32g"], health="Unhealthy")]}
        ),
        VNPUNodeStatus.model_validate({"chips": [_chip(0, "910", [])]}),
        VNPUNodeStatus(),
    ]
    offered = OfferedTemplates.from_node_statuses(statuses)
    assert dict(offered.by_model) == {
        "910B3": frozenset({"vir05_1c_16g", "vir10_3c_32g"}),
        "310P3": frozenset({"vir01"}),
    }
    assert offered.models() == ["310P3", "910B3"]
    assert offered.models_offering("vir01") == ["310P3"]
    assert offered.describe() == "310P3: vir01; 910B3: vir05_1c_16g, vir10_3c_32g"


def test_offered_is_immutable() -> None:
    source = {"910B3": {"vir05_1c_16g"}}
    offered = OfferedTemplates(source)  # type: ignore[arg-type]
    source["910B3"].add("vir10_3c_32g")
    assert offered.by_model["910B3"] == frozenset({"vir05_1c_16g"})
    with pytest.raises(TypeError):
        offered.by_model["x"] = frozenset()  # type: ignore[index]
    assert OfferedTemplates().empty
    assert OfferedTemplates.from_node_statuses([]).empty


def test_valid_pod_passes(make_pod: PodFactory, offered: OfferedTemplates) -> None:
    pod = make_pod({names.ANN_COUNT: "4", names.ANN_CHIP_MODEL: "910B3"})
    assert validate_pod(pod, offered) == []


def test_pod_without_template_is_not_ours(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_COUNT: "garbage"}, template=None)
    assert validate_pod(pod, OfferedTemplates()) == []


def test_template_offered_by_nobody_lists_offer(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    assert validate_pod(make_pod(template="vir99"), offered) == [
        f'vnpu.io/template "vir99" is not offered by any node; offered: {OFFERED_ALL}'
    ]


def test_empty_cluster_says_so(make_pod: PodFactory) -> None:
    assert validate_pod(make_pod(), OfferedTemplates()) == [
        'vnpu.io/template "vir05_1c_16g" is not offered by any node: the cluster offers no '
        "vNPU templates yet (no VNPUNode reports a chip)"
    ]


def test_unknown_inventory_skips_cluster_checks(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_CHIP_MODEL: "999X"}, template="vir99")
    assert validate_pod(pod, None) == []
    bad = make_pod({names.ANN_COUNT: "0"}, template="vir99")
    assert validate_pod(bad, None) == [
        'vnpu.io/count "0" is out of range; expected an integer from 1 to 8'
    ]


def test_unknown_chip_model_lists_known(make_pod: PodFactory, offered: OfferedTemplates) -> None:
    pod = make_pod({names.ANN_CHIP_MODEL: "910B4"})
    assert validate_pod(pod, offered) == [
        'vnpu.io/chip-model "910B4" is not a chip model of this cluster; known models: 310P3, 910B3'
    ]


def test_chip_model_case_hint(make_pod: PodFactory, offered: OfferedTemplates) -> None:
    (problem,) = validate_pod(make_pod({names.ANN_CHIP_MODEL: "910b3"}), offered)
    assert '"910b3" is not a chip model of this cluster (did you mean 910B3?)' in problem


def test_template_not_offered_by_chosen_model(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = make_pod({names.ANN_CHIP_MODEL: "910B3"}, template="vir01")
    assert validate_pod(pod, offered) == [
        'vnpu.io/template "vir01" is not offered by chip model "910B3" (vnpu.io/chip-model); '
        f"{OFFERED_910B3}; vir01 is offered by: 310P3"
    ]


def test_unknown_model_and_unknown_template_give_two_messages(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = make_pod({names.ANN_CHIP_MODEL: "910B4"}, template="vir99")
    problems = validate_pod(pod, offered)
    assert len(problems) == 2
    assert problems[0].startswith('vnpu.io/chip-model "910B4"')
    assert problems[1].startswith('vnpu.io/template "vir99" is not offered by any node')


def test_unknown_model_with_offered_template_gives_one_message(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    problems = validate_pod(make_pod({names.ANN_CHIP_MODEL: "910B4"}), offered)
    assert len(problems) == 1
    assert problems[0].startswith('vnpu.io/chip-model "910B4"')


def test_malformed_template_is_not_also_reported_unoffered(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    (problem,) = validate_pod(make_pod(template="gpu"), offered)
    assert 'vnpu.io/template "gpu" is not a valid template name' in problem


def test_every_problem_reported_once(make_pod: PodFactory, offered: OfferedTemplates) -> None:
    pod = make_pod(
        {names.ANN_COUNT: "2.0", names.ANN_CHIP_MODEL: "", names.ANN_CONTAINERS: "ghost"},
        template="vir99",
    )
    problems = validate_pod(pod, offered)
    assert [p.split(" ", 1)[0] for p in problems] == [
        names.ANN_COUNT,
        names.ANN_CHIP_MODEL,
        names.ANN_CONTAINERS,
        names.ANN_TEMPLATE,
    ]


def test_node_name_is_rejected(make_pod: PodFactory, offered: OfferedTemplates) -> None:
    assert validate_pod(make_pod(nodeName="npu-1"), offered) == [
        'vnpu.io/template cannot be used with spec.nodeName ("npu-1"): the operator picks '
        "the node; use a nodeSelector or node affinity instead"
    ]


# The DeviceClass vnpu.io as an extended resource (KEP-5004): the chart's
# dra-extended-resource policy refuses it on every pod, the webhook on the pods it sees.
DRA_RESOURCE = f"deviceclass.resource.kubernetes.io/{names.DRA_DEVICE_CLASS}"


def _asking(name: str, where: str) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "resources": {where: {DRA_RESOURCE: "1"}}}


@pytest.mark.parametrize("where", ["limits", "requests"])
def test_the_device_class_as_an_extended_resource_is_refused(
    make_pod: PodFactory, offered: OfferedTemplates, where: str
) -> None:
    pod = make_pod(
        containers=["app", _asking("main", where)], init_containers=[_asking("i", where)]
    )
    (problem,) = validate_pod(pod, offered)
    assert problem.startswith(f"container main, init container i: resources {DRA_RESOURCE} "), (
        problem
    )
    assert "not supported for vNPUs" in problem
    assert f"requests.{names.RES_VNPUS}" in problem
    assert names.ANN_TEMPLATE in problem
    assert "ResourceClaim" in problem
    # ... also when the inventory is not known yet: the refusal needs none.
    assert validate_pod(pod, None) == [problem]


def test_pod_level_resources_naming_the_class_are_refused(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = make_pod(resources={"limits": {DRA_RESOURCE: "1", "cpu": "1"}})
    (problem,) = validate_pod(pod, offered)
    assert problem.startswith(f"pod: resources {DRA_RESOURCE} ")


def test_other_resources_and_other_classes_pass(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    other = {
        "name": "main",
        "image": "busybox",
        "resources": {
            "limits": {"deviceclass.resource.kubernetes.io/gpu.example.com": "1", "cpu": "1"},
            "claims": [{"name": "npu"}],
        },
    }
    assert validate_pod(make_pod(containers=[other]), offered) == []
    # Bad shapes are the API server's to refuse, not a crash here.
    odd = make_pod(containers=[{"name": "x", "resources": ["no"]}, "y"], resources="z")
    assert validate_pod(odd, offered) == []


def test_the_webhooks_refuse_the_class_as_an_extended_resource(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = make_pod(containers=[_asking("main", "limits")])
    for decide in (decide_mutation, decide_validation):
        decision = decide(pod, offered)
        assert not decision.allowed
        (problem,) = decision.problems
        assert problem.startswith(f"container main: resources {DRA_RESOURCE} ")
