"""The webhook charges each vNPU pod its vNPUs in extended resources, so quota counts them."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest
from conftest import PodFactory

from vnpu_common.wire import names
from vnpu_common.wire.quantity import quantity_value
from vnpu_operator.admission import OfferedTemplates
from vnpu_operator.admission.charges import Charge, charge_for
from vnpu_operator.admission.decisions import NOT_SYNCED, decide_mutation, decide_validation
from vnpu_operator.admission.quotas import QuotaBook

AICORE, MEMORY, VNPUS = names.RES_AICORE, names.RES_MEMORY_MB, names.RES_VNPUS
# The default template's own resource: quota on requests.vnpu.io/<template> counts it.
TEMPLATE = names.template_resource("vir05_1c_16g")


def _admit(pod: dict[str, Any], offered: OfferedTemplates) -> dict[str, Any]:
    decision = decide_mutation(pod, offered)
    assert decision.allowed, decision.problems
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, decision.patch)
    assert decide_validation(patched, offered).allowed
    assert decide_mutation(patched, offered).patch == []  # reinvocation changes nothing
    return patched


def _requests(container: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    resources = container.get("resources") or {}
    return resources.get("requests") or {}, resources.get("limits") or {}


def test_count_times_template_is_charged_to_the_first_container(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = make_pod(containers=["app", "sidecar"], annotations={names.ANN_COUNT: "3"})
    patched = _admit(pod, offered)
    app, sidecar = patched["spec"]["containers"]
    want = {AICORE: "15", MEMORY: str(3 * 16384), VNPUS: "3", TEMPLATE: "3"}
    assert _requests(app) == (want, want)
    assert _requests(sidecar) == ({}, {})


def test_the_charge_goes_to_a_container_named_in_vnpu_containers(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    pod = make_pod(
        containers=["app", "worker"],
        init_containers=["setup"],
        annotations={names.ANN_CONTAINERS: "setup,worker"},
    )
    patched = _admit(pod, offered)
    (setup,) = patched["spec"]["initContainers"]
    app, worker = patched["spec"]["containers"]
    assert _requests(worker)[0] == {AICORE: "5", MEMORY: "16384", VNPUS: "1", TEMPLATE: "1"}
    assert _requests(app) == ({}, {})
    assert _requests(setup) == ({}, {})


def test_what_a_user_wrote_for_our_resources_is_replaced_and_removed(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    forged = {AICORE: "1", "vnpu.io/other": "7", "cpu": "500m"}
    pod = make_pod(
        containers=[
            {"name": "app", "image": "x", "resources": {"requests": dict(forged)}},
            {"name": "b", "image": "x", "resources": {"limits": {VNPUS: "9", "memory": "1Gi"}}},
        ],
        init_containers=[{"name": "i", "image": "x", "resources": {"requests": {MEMORY: "1"}}}],
    )
    patched = _admit(pod, offered)
    app, b = patched["spec"]["containers"]
    want = {AICORE: "5", MEMORY: "16384", VNPUS: "1", TEMPLATE: "1"}
    assert _requests(app) == ({**want, "cpu": "500m"}, want)
    assert _requests(b) == ({}, {"memory": "1Gi"})
    assert _requests(patched["spec"]["initContainers"][0]) == ({}, {})


def test_a_value_the_api_server_wrote_back_in_its_own_form_is_kept(
    make_pod: PodFactory,
) -> None:
    offered = OfferedTemplates.of_sizes({"910B3": {"vir05_1c_16g": (5, 16000)}})
    patched = _admit(make_pod(), offered)
    stored = patched["spec"]["containers"][0]["resources"]
    stored["requests"][MEMORY] = stored["limits"][MEMORY] = "16k"  # canonical form of 16000
    assert decide_mutation(patched, offered).patch == []
    assert decide_validation(patched, offered).allowed


def test_a_pod_with_our_resources_changed_after_mutation_is_refused(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    patched = _admit(make_pod(), offered)
    patched["spec"]["containers"][0]["resources"]["requests"][AICORE] = "1"
    decision = decide_validation(patched, offered)
    assert not decision.allowed
    assert "resources" in decision.problems[0]


def test_a_template_sized_differently_per_model_needs_a_chip_model(
    make_pod: PodFactory,
) -> None:
    offered = OfferedTemplates.of_sizes(
        {"310P3": {"vir04": (4, 12288)}, "910": {"vir04": (4, 4096)}}
    )
    decision = decide_mutation(make_pod(template="vir04"), offered)
    assert not decision.allowed
    (problem,) = decision.problems
    assert "310P3: 4 AICore, 12288 MB; 910: 4 AICore, 4096 MB" in problem
    assert names.ANN_CHIP_MODEL in problem
    pod = make_pod(template="vir04", annotations={names.ANN_CHIP_MODEL: "910"})
    assert _requests(_admit(pod, offered)["spec"]["containers"][0])[0][MEMORY] == "4096"


def test_a_template_sized_alike_on_every_model_needs_none(make_pod: PodFactory) -> None:
    offered = OfferedTemplates.of_sizes(
        {"910B3": {"vir05_1c_16g": (5, 16384)}, "910B4": {"vir05_1c_16g": (5, 16384)}}
    )
    assert charge_for("vir05_1c_16g", 2, None, offered) == Charge(10, 32768, 2, "vir05_1c_16g")
    assert _admit(make_pod(), offered)


def test_nothing_is_admitted_before_the_operator_knows_the_chips(make_pod: PodFactory) -> None:
    for decide in (decide_mutation, decide_validation):
        decision = decide(make_pod(), None)
        assert not decision.allowed
        assert decision.problems == [NOT_SYNCED]
    assert decide_mutation(make_pod(template=None), None).allowed  # not ours


def test_a_pod_without_regular_containers_is_refused(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    decision = decide_mutation(make_pod(containers=[], init_containers=["i"]), offered)
    assert not decision.allowed
    assert "no container" in " ".join(decision.problems)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4", 4), ("16k", 16000), ("2Ki", 2048), ("1M", 1000000), (7, 7), ("1.5", None),
     ("4m", None), ("", None), (True, None), (None, None), ("1e3", None)],
)  # fmt: skip
def test_quantity_values(value: object, expected: int | None) -> None:
    assert quantity_value(value) == expected


def _quota(name: str, hard: dict[str, str], used: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": name},
        "spec": {"hard": hard, **spec},
        "status": {"hard": hard, "used": used},
    }


def test_a_pod_over_its_namespace_quota_is_told_namespace_resource_used_and_hard(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    book = QuotaBook()
    book.seen(_quota("vnpu", {"requests.vnpu.io/aicore": "12", "pods": "9"},
                     {"requests.vnpu.io/aicore": "5", "pods": "1"}))  # fmt: skip
    book.seen(_quota("other", {"requests.cpu": "4"}, {}))  # not about vNPUs: ignored
    assert book.exceeded("team-a", Charge(5, 16384, 1)) is None  # 5 + 5 <= 12
    refusal = book.exceeded("team-a", Charge(10, 32768, 2))
    assert refusal == (
        "namespace team-a is over its vNPU quota: requests.vnpu.io/aicore requested 10, "
        "used 5, hard 12 (ResourceQuota team-a/vnpu); the pod may be created once vNPU "
        "pods of the namespace end, or an admin raises the quota"
    )
    assert book.exceeded("team-b", Charge(100, 1, 1)) is None  # another namespace's quota

    def over(charge: Charge) -> str | None:
        return book.exceeded("team-a", charge)

    pod = make_pod(annotations={names.ANN_COUNT: "2"})
    decision = decide_mutation(pod, offered, "", over)
    assert not decision.allowed
    assert decision.problems == [refusal]
    assert decide_mutation(make_pod(), offered, "", over).allowed


def test_scoped_and_deleted_quotas_are_left_to_the_api_server() -> None:
    book = QuotaBook()
    hard = {"requests.vnpu.io/vnpus": "1"}
    book.seen(_quota("scoped", hard, {"requests.vnpu.io/vnpus": "1"}, scopes=["BestEffort"]))
    assert book.exceeded("team-a", Charge(1, 1, 1)) is None
    book.seen(_quota("plain", hard, {"requests.vnpu.io/vnpus": "1"}))
    assert book.exceeded("team-a", Charge(1, 1, 1)) is not None
    book.seen(_quota("plain", hard, {}), deleted=True)
    assert book.exceeded("team-a", Charge(1, 1, 1)) is None
    assert book.quotas("team-a") == []


def test_a_pod_that_already_carries_its_charge_is_admitted_as_it_is(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    """Kueue admits a Job by its pod template, so the template carries the same
    charge the webhook would write (docs/USAGE.md, Quota with Kueue): the pods the
    Job makes keep it, their resources untouched. (Limits alone reach the webhook as
    requests and limits: the API server defaults requests before admission.)"""
    want = {AICORE: "10", MEMORY: str(2 * 16384), VNPUS: "2", TEMPLATE: "2"}
    resources = {"requests": {**want, "cpu": "1"}, "limits": dict(want)}
    pod = make_pod(
        containers=[{"name": "app", "image": "x", "resources": resources}],
        annotations={names.ANN_COUNT: "2"},
    )
    decision = decide_mutation(pod, offered)
    assert decision.allowed, decision.problems
    touched = [op["path"] for op in decision.patch if "/resources" in op["path"]]
    assert touched == []
    assert _admit(pod, offered)["spec"]["containers"][0]["resources"] == resources
    # A charge that is not the pod's true one is corrected: Kueue would have counted
    # the template's, the namespace's quota counts the pod's.
    wrong = {AICORE: "5", MEMORY: "16384", VNPUS: "1"}
    pod = make_pod(
        containers=[{"name": "app", "image": "x",
                     "resources": {"requests": dict(wrong), "limits": dict(wrong)}}],
        annotations={names.ANN_COUNT: "2"},
    )  # fmt: skip
    assert _requests(_admit(pod, offered)["spec"]["containers"][0]) == (want, want)
