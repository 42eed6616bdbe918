"""One request on every cluster: `limits: {vnpu.io/<template>: N}` goes to DRA where a DRA
node offers the template, and becomes the annotation path's request elsewhere."""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonpatch
import pytest
from conftest import PodFactory

from vnpu_common.wire import names
from vnpu_operator.admission import OfferedTemplates
from vnpu_operator.admission.decisions import NOT_SYNCED, decide_mutation, decide_validation
from vnpu_operator.admission.limits import Routing

SMALL, BIG = "vir05_1c_16g", "vir10_3c_32g"
SMALL_RES, BIG_RES = names.template_resource(SMALL), names.template_resource(BIG)
DRA_ON = Routing(extended_resources=True)
NO_DRA = Routing()


def _limits(name: str, **amounts: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", "resources": {"limits": dict(amounts)}}


def _small(name: str, n: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", "resources": {"limits": {SMALL_RES: n}}}


def _pod(make_pod: PodFactory, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return make_pod(template=None, containers=list(containers), **spec)


def _admit(
    pod: dict[str, Any], offered: OfferedTemplates, routing: Routing = NO_DRA
) -> dict[str, Any]:
    decision = decide_mutation(pod, offered, routing=routing)
    assert decision.allowed, decision.problems
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, decision.patch)
    assert decide_validation(patched, offered, routing=routing).allowed
    assert decide_mutation(patched, offered, routing=routing).patch == []  # reinvocation
    return patched


def _on_dra(offered: OfferedTemplates, *templates: str) -> OfferedTemplates:
    return dataclasses.replace(offered, dra=frozenset(templates))


def test_without_dra_the_request_becomes_the_annotation_paths(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = _pod(make_pod, _small("app", "2"), {"name": "log", "image": "x"})
    patched = _admit(pod, offered)
    annotations = patched["metadata"]["annotations"]
    assert annotations[names.ANN_TEMPLATE] == SMALL
    assert annotations[names.ANN_COUNT] == "2"
    assert annotations[names.ANN_CONTAINERS] == "app"
    assert {"name": names.SCHEDULING_GATE} in patched["spec"]["schedulingGates"]
    app, log = patched["spec"]["containers"]
    # The charge keeps the pod's own request: quota on requests.vnpu.io/<template> counts it.
    want = {names.RES_AICORE: "10", names.RES_MEMORY_MB: "32768", names.RES_VNPUS: "2",
            SMALL_RES: "2"}  # fmt: skip
    assert app["resources"]["limits"] == want
    assert app["resources"]["requests"] == want
    assert log.get("resources", {}).get("limits", {}) == {}
    env = {e["name"]: e for e in log["env"]}
    assert env[names.ENV_VISIBLE_DEVICES] == {"name": names.ENV_VISIBLE_DEVICES, "value": ""}


def test_the_containers_that_ask_add_up_and_see_the_vnpus(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = _pod(make_pod, _small("a", 1), {"name": "idle", "image": "x"}, _small("b", 2))
    patched = _admit(pod, offered)
    annotations = patched["metadata"]["annotations"]
    assert (annotations[names.ANN_COUNT], annotations[names.ANN_CONTAINERS]) == ("3", "a,b")
    a, idle, b = patched["spec"]["containers"]
    assert a["resources"]["limits"][SMALL_RES] == "3"  # the whole charge on one container
    assert SMALL_RES not in b["resources"]["limits"]
    visible = {c["name"]: {e["name"]: e for e in c["env"]}[names.ENV_VISIBLE_DEVICES]
               for c in (a, idle, b)}  # fmt: skip
    assert "valueFrom" in visible["a"]
    assert "valueFrom" in visible["b"]
    assert visible["idle"].get("value") == ""


def test_a_plain_init_container_counts_alone_a_sidecar_with_the_containers(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = _pod(make_pod, _small("app", 1), init_containers=[_small("warm", 2)])
    assert _admit(pod, offered)["metadata"]["annotations"][names.ANN_COUNT] == "2"
    sidecar = {**_small("proxy", 2), "restartPolicy": "Always"}
    pod = _pod(make_pod, _small("app", 1), init_containers=[sidecar])
    assert _admit(pod, offered)["metadata"]["annotations"][names.ANN_COUNT] == "3"


def test_where_a_dra_node_offers_the_template_the_scheduler_serves_it(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = _pod(make_pod, _small("app", 2))
    patched = _admit(pod, _on_dra(offered, SMALL), DRA_ON)
    assert patched == pod  # no annotation, no gate, no charge: the claim is the scheduler's
    # The release does not serve templates as extended resources: the annotation path.
    patched = _admit(pod, _on_dra(offered, SMALL), Routing(extended_resources=False))
    assert patched["metadata"]["annotations"][names.ANN_TEMPLATE] == SMALL
    # Only annotation nodes offer it: the annotation path.
    patched = _admit(pod, _on_dra(offered, BIG), DRA_ON)
    assert patched["metadata"]["annotations"][names.ANN_TEMPLATE] == SMALL


def test_a_pod_naming_a_chip_model_goes_the_annotation_path(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    """A template's class on DRA nodes spans every model offering it: only the
    annotation path honours vnpu.io/chip-model."""
    pod = make_pod(template=None, containers=[_small("app", 1)],
                   annotations={names.ANN_CHIP_MODEL: "910B3"})  # fmt: skip
    patched = _admit(pod, _on_dra(offered, SMALL), DRA_ON)
    assert patched["metadata"]["annotations"][names.ANN_TEMPLATE] == SMALL
    assert patched["metadata"]["annotations"][names.ANN_CHIP_MODEL] == "910B3"


def test_on_a_mixed_cluster_a_dra_pod_is_kept_off_annotation_nodes(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    """Annotation nodes list vnpu.io/<template> in their capacity (the scheduler
    would put a DRA pod there with no vNPU): the DRA nodes' labels are ANDed in."""
    routing = Routing(extended_resources=True, dra_node_selector={"vnpu.io/mode": "dra"})
    on_dra = _on_dra(offered, SMALL)
    patched = _admit(_pod(make_pod, _small("app", 1)), on_dra, routing)
    assert patched["spec"]["nodeSelector"] == {"vnpu.io/mode": "dra"}
    pod = _pod(make_pod, _small("app", 1), nodeSelector={"zone": "a"})
    assert _admit(pod, on_dra, routing)["spec"]["nodeSelector"] == {
        "zone": "a",
        "vnpu.io/mode": "dra",
    }
    clash = _pod(make_pod, _small("app", 1), nodeSelector={"vnpu.io/mode": "annotation"})
    decision = decide_mutation(clash, on_dra, routing=routing)
    assert not decision.allowed
    assert "vnpu.io/mode=dra" in decision.problems[0]


def test_several_templates_need_dra(make_pod: PodFactory, offered: OfferedTemplates) -> None:
    pod = _pod(make_pod, _small("a", 1), _limits("b", **{BIG_RES: 1}))
    decision = decide_mutation(pod, offered, routing=DRA_ON)
    assert not decision.allowed
    assert "one template" in decision.problems[0]
    assert _admit(pod, _on_dra(offered, SMALL, BIG), DRA_ON) == pod


def test_more_than_the_annotation_path_gives_is_refused(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    decision = decide_mutation(_pod(make_pod, _small("a", 9)), offered)
    assert not decision.allowed
    assert "at most 8" in decision.problems[0]


@pytest.mark.parametrize("value", ["500m", "1.5", "1k", "-1", "x"])
def test_a_count_that_is_not_a_whole_number_is_refused(
    make_pod: PodFactory, offered: OfferedTemplates, value: str
) -> None:
    decision = decide_mutation(_pod(make_pod, _small("app", value)), offered)
    assert not decision.allowed
    assert "whole number" in " ".join(decision.problems)


def test_requests_that_differ_from_limits_are_refused(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    container = _small("app", 2)
    container["resources"]["requests"] = {SMALL_RES: 1}
    decision = decide_mutation(_pod(make_pod, container), offered)
    assert not decision.allowed
    assert "same in requests and limits" in decision.problems[0]


def test_a_dra_pod_may_not_carry_the_annotation_paths_charges(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = _pod(make_pod, _limits("app", **{SMALL_RES: 1, names.RES_VNPUS: 1}))
    decision = decide_mutation(pod, _on_dra(offered, SMALL), routing=DRA_ON)
    assert not decision.allowed
    assert names.RES_VNPUS in decision.problems[0]


def test_the_implicit_class_names_are_refused_beside_a_template_request(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    implicit = f"deviceclass.resource.kubernetes.io/{names.template_device_class(SMALL)}"
    pod = _pod(make_pod, _limits("app", **{SMALL_RES: 1, implicit: 1}))
    decision = decide_mutation(pod, _on_dra(offered, SMALL), routing=DRA_ON)
    assert not decision.allowed
    assert implicit in " ".join(decision.problems)


def test_nothing_is_decided_before_the_operator_knows_the_chips(make_pod: PodFactory) -> None:
    pod = _pod(make_pod, _small("app", 1))
    for decide in (decide_mutation, decide_validation):
        decision = decide(pod, None, routing=DRA_ON)
        assert not decision.allowed
        assert decision.problems == [NOT_SYNCED]


def test_a_template_nobody_offers_is_refused_with_what_is(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = _pod(make_pod, _limits("app", **{names.template_resource("vir99"): 1}))
    decision = decide_mutation(pod, offered, routing=DRA_ON)
    assert not decision.allowed
    assert "not offered by any node" in decision.problems[0]


def test_names_map_one_to_one() -> None:
    assert names.template_resource("vir10_4c_16g_m") == "vnpu.io/vir10_4c_16g_m"
    assert names.template_of_resource("vnpu.io/vir10_4c_16g_m") == "vir10_4c_16g_m"
    assert names.template_device_class("vir10_4c_16g_m") == "vir10-4c-16g-m.vnpu.io"
    for reserved in (names.RES_VNPUS, names.RES_AICORE, names.RES_MEMORY_MB, "vnpu.io/Vir01"):
        assert names.template_of_resource(reserved) is None
