"""Reading a pod's vNPU request: annotations and scheduling directives."""

from __future__ import annotations

from typing import Any

import pytest

from localplane.pods import vnpu_pod
from vnpu_common.wire import names
from vnpu_operator.annotations import parse_annotations
from vnpu_operator.placement import InvalidRequestError, PodRequest


def pod(annotations: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return vnpu_pod(
        "train-0",
        "ml",
        template=None,
        annotations=annotations,
        uid="0b7c2e4c-3f1a-4b2e-9a51-1f6f0b0d9a11",
        spec=spec,
    )


def test_annotations_with_defaults() -> None:
    req = PodRequest.from_pod(pod({names.ANN_TEMPLATE: "vir05_1c_16g"}))
    assert (req.template, req.count, req.chip_model, req.containers) == (
        "vir05_1c_16g",
        1,
        None,
        None,
    )


def test_annotations_all_set() -> None:
    raw = pod(
        {
            names.ANN_TEMPLATE: "vir10_3c_32g",
            names.ANN_COUNT: "8",
            names.ANN_CHIP_MODEL: "910B3",
            names.ANN_CONTAINERS: "main, sidecar",
        },
        containers=[{"name": "main"}, {"name": "sidecar"}],
    )
    req = PodRequest.from_pod(raw)
    assert (req.template, req.count, req.chip_model, req.containers) == (
        "vir10_3c_32g",
        8,
        "910B3",
        ("main", "sidecar"),
    )


def test_containers_listed_twice_or_spaced_read_as_the_webhook_admits_them() -> None:
    raw = pod(
        {names.ANN_TEMPLATE: "vir01", names.ANN_CONTAINERS: "init , main,init"},
        initContainers=[{"name": "init"}],
    )
    assert PodRequest.from_pod(raw).containers == ("init", "main")


def test_cached_copy_without_containers_reads_the_containers_annotation() -> None:
    raw = pod({names.ANN_TEMPLATE: "vir01", names.ANN_CONTAINERS: "main,ghost"})
    with pytest.raises(InvalidRequestError, match='names "ghost", not in this pod'):
        PodRequest.from_pod(raw)
    # The operator's cache drops the containers; the webhook matched the names.
    del raw["spec"]["containers"]
    assert PodRequest.from_pod(raw).containers == ("main", "ghost")


@pytest.mark.parametrize("annotations", [None, {}, {"other": "x"}])
def test_no_template_means_not_opted_in(annotations: dict[str, str] | None) -> None:
    raw = pod()
    raw["metadata"]["annotations"] = annotations
    with pytest.raises(InvalidRequestError) as info:
        PodRequest.from_pod(raw)
    assert info.value.field == names.ANN_TEMPLATE
    assert str(info.value) == "pod has no vnpu.io/template annotation"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (names.ANN_TEMPLATE, "vir5"),
        (names.ANN_TEMPLATE, "VIR05_1c_16g"),
        (names.ANN_TEMPLATE, "vir05_" + "x" * 30),
        (names.ANN_TEMPLATE, ""),
        (names.ANN_COUNT, "0"),
        (names.ANN_COUNT, "9"),
        (names.ANN_COUNT, "-1"),
        (names.ANN_COUNT, "two"),
        (names.ANN_COUNT, " 2"),
        (names.ANN_COUNT, "1_0"),
        (names.ANN_COUNT, "08"),
        (names.ANN_COUNT, ""),
        (names.ANN_CHIP_MODEL, ""),
        (names.ANN_CHIP_MODEL, "910 B3"),
        (names.ANN_CONTAINERS, "main,,side"),
        (names.ANN_CONTAINERS, "Main"),
        (names.ANN_CONTAINERS, "ghost"),
    ],
)
def test_malformed_annotation_names_its_key(key: str, value: str) -> None:
    annotations = {names.ANN_TEMPLATE: "vir05_1c_16g", key: value}
    with pytest.raises(InvalidRequestError) as info:
        PodRequest.from_pod(pod(annotations))
    assert info.value.field == key
    assert key in str(info.value)


def test_malformed_annotations_carry_the_webhooks_messages() -> None:
    annotations = {names.ANN_TEMPLATE: "VIR05", names.ANN_COUNT: "08"}
    with pytest.raises(InvalidRequestError) as info:
        PodRequest.from_pod(pod(annotations))
    assert info.value.field == names.ANN_TEMPLATE
    assert str(info.value).split("\n") == parse_annotations(pod(annotations)).problems
    assert str(info.value).split("\n")[1] == (
        'vnpu.io/count "08" has a leading zero; expected an integer from 1 to 8'
    )


def test_non_string_annotation_value_is_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="must be a string"):
        PodRequest.from_pod(pod({names.ANN_TEMPLATE: "vir01", names.ANN_COUNT: 2}))


def test_from_pod_reads_identity_annotations_and_directives() -> None:
    required = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}
    tolerations = [{"key": "npu", "operator": "Exists", "effect": "NoSchedule"}]
    req = PodRequest.from_pod(
        pod(
            {names.ANN_TEMPLATE: "vir05_1c_16g", names.ANN_COUNT: "2"},
            nodeSelector={"zone": "a"},
            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
            tolerations=tolerations,
        )
    )
    assert (req.namespace, req.name, req.key) == ("ml", "train-0", "ml/train-0")
    assert req.uid == "0b7c2e4c-3f1a-4b2e-9a51-1f6f0b0d9a11"
    assert (req.template, req.count, req.chip_model) == ("vir05_1c_16g", 2, None)
    assert req.node_selector == {"zone": "a"}
    assert req.required_affinity == required
    assert req.affinity_terms is not None
    assert len(req.affinity_terms) == 1
    assert req.tolerations == tuple(tolerations)
    assert req.compiled_tolerations[0].key == "npu"


def test_from_pod_without_affinity_has_no_terms() -> None:
    req = PodRequest.from_pod(
        pod({names.ANN_TEMPLATE: "vir01"}, affinity={"podAffinity": {}}, tolerations=None)
    )
    assert req.required_affinity is None
    assert req.affinity_terms is None
    assert req.tolerations == ()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"nodeSelector": {"zone": 1}}, "spec.nodeSelector"),
        ({"nodeSelector": ["zone"]}, "spec.nodeSelector"),
        ({"tolerations": {"key": "x"}}, "spec.tolerations"),
        ({"tolerations": [{"key": "", "operator": "Equal"}]}, "spec.tolerations[0].operator"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "v"}]}, "value"),
        ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "operator"),
        ({"tolerations": [{"key": "a", "effect": "Sometimes"}]}, "effect"),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "a", "operator": "Near"}]}
                            ]
                        }
                    }
                }
            },
            "matchExpressions[0].operator",
        ),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "a"}}},
            "requiredDuringSchedulingIgnoredDuringExecution",
        ),
    ],
)
def test_from_pod_rejects_malformed_directives(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        PodRequest.from_pod(pod({names.ANN_TEMPLATE: "vir01"}, **spec))
    assert field in info.value.field


@pytest.mark.parametrize("missing", ["name", "namespace", "uid"])
def test_from_pod_requires_identity(missing: str) -> None:
    raw = pod({names.ANN_TEMPLATE: "vir01"})
    del raw["metadata"][missing]
    with pytest.raises(InvalidRequestError) as info:
        PodRequest.from_pod(raw)
    assert info.value.field == f"metadata.{missing}"


@pytest.mark.parametrize("raw", [None, [], "pod", {"metadata": []}])
def test_from_pod_rejects_non_objects(raw: Any) -> None:
    with pytest.raises(InvalidRequestError):
        PodRequest.from_pod(raw)


@pytest.mark.parametrize("count", [0, 9])
def test_constructor_checks_count(count: int) -> None:
    with pytest.raises(InvalidRequestError, match="out of range"):
        PodRequest(namespace="a", name="b", uid="c", template="vir01", count=count)


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"count": "2"}, names.ANN_COUNT, 'vnpu.io/count must be an integer, got "2"'),
        ({"count": True}, names.ANN_COUNT, "vnpu.io/count must be an integer, got true"),
        ({"template": "VIR01"}, names.ANN_TEMPLATE, 'vnpu.io/template "VIR01" is not a valid'),
        (
            {"chip_model": "910 B3"},
            names.ANN_CHIP_MODEL,
            'vnpu.io/chip-model "910 B3" is not a chip',
        ),
    ],
)
def test_constructor_checks_as_the_annotations_are(
    kwargs: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        PodRequest(**{"namespace": "a", "name": "b", "uid": "c", "template": "vir01", **kwargs})
    assert info.value.field == field
    assert str(info.value).startswith(message)
