"""Parsing of the vnpu.io annotations (vnpu_operator.annotations, read by the
webhook and the operator alike): every malformed value has its own message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from vnpu_common.wire import names
from vnpu_operator.annotations import (
    AnnotationError,
    VNPURequest,
    chip_model_problem,
    count_problem,
    parse_annotations,
    parse_request,
    pod_containers,
    template_problem,
)

PodFactory = Callable[..., dict[str, Any]]


def test_parse_request_reads_every_annotation(make_pod: PodFactory) -> None:
    pod = make_pod(
        {
            names.ANN_COUNT: "2",
            names.ANN_CHIP_MODEL: "910B3",
            names.ANN_CONTAINERS: "app, sidecar,app",
        },
        containers=["app", "sidecar"],
    )
    assert parse_request(pod) == VNPURequest(
        template="vir05_1c_16g", count=2, chip_model="910B3", containers=("app", "sidecar")
    )


def test_parse_request_defaults(make_pod: PodFactory) -> None:
    assert parse_request(make_pod()) == VNPURequest(template="vir05_1c_16g")


def test_parse_request_without_template_raises(make_pod: PodFactory) -> None:
    with pytest.raises(AnnotationError, match=r"pod has no vnpu\.io/template annotation"):
        parse_request(make_pod(template=None))


def test_parse_request_raises_with_every_problem(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_COUNT: "9", names.ANN_CONTAINERS: "nope"}, template="VIR05")
    with pytest.raises(AnnotationError) as info:
        parse_request(pod)
    assert len(info.value.problems) == 3
    assert str(info.value) == "\n".join(info.value.problems)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "vnpu.io/template is empty; name a template, e.g. vir05_1c_16g"),
        (" vir01", 'vnpu.io/template " vir01" has leading or trailing whitespace'),
        ("VIR05", 'vnpu.io/template "VIR05" is not a valid template name: expected'),
        ("vir5", 'vnpu.io/template "vir5" is not a valid template name'),
        ("vir05-1c", 'vnpu.io/template "vir05-1c" is not a valid template name'),
        ("vir05_", 'vnpu.io/template "vir05_" is not a valid template name'),
        ("vir05\n", 'vnpu.io/template "vir05\\n" has leading or trailing whitespace'),
        ("vir05_" + "a" * 26, "is 32 characters long; template names have at most 31"),
        (5, "vnpu.io/template must be a string, got 5"),
    ],
)
def test_template_rejections(make_pod: PodFactory, value: object, message: str) -> None:
    problems = parse_annotations(make_pod(template=value)).problems
    assert len(problems) == 1
    assert message in problems[0]


def test_template_at_max_length_passes(make_pod: PodFactory) -> None:
    template = "vir05_" + "a" * 25
    assert parse_request(make_pod(template=template)).template == template


def test_long_value_is_cut_in_the_message(make_pod: PodFactory) -> None:
    (problem,) = parse_annotations(make_pod(template="x" * 10_000)).problems
    assert len(problem) < 200
    assert '"... is 10000 characters long' in problem


@pytest.mark.parametrize(("value", "count"), [("1", 1), ("8", 8), ("3", 3)])
def test_count_accepted(make_pod: PodFactory, value: str, count: int) -> None:
    assert parse_request(make_pod({names.ANN_COUNT: value})).count == count


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "vnpu.io/count is empty; expected an integer from 1 to 8 (remove it for 1)"),
        ("01", 'vnpu.io/count "01" has a leading zero; expected an integer from 1 to 8'),
        (" 2", 'vnpu.io/count " 2" has leading or trailing whitespace; expected an integer'),
        ("2 ", 'vnpu.io/count "2 " has leading or trailing whitespace'),
        ("2.0", 'vnpu.io/count "2.0" is not a whole number; expected an integer from 1 to 8'),
        ("+2", 'vnpu.io/count "+2" is not a whole number'),
        ("two", 'vnpu.io/count "two" is not a whole number'),
        ("\u0662", 'vnpu.io/count "\u0662" is not a whole number'),  # Arabic-Indic two
        ("-1", 'vnpu.io/count "-1" is out of range; expected an integer from 1 to 8'),
        ("0", 'vnpu.io/count "0" is out of range'),
        ("9", 'vnpu.io/count "9" is out of range'),
        ("10", 'vnpu.io/count "10" is out of range'),
        ("9" * 5000, "is out of range"),
        (2, "vnpu.io/count must be a string, got 2; expected an integer from 1 to 8"),
    ],
)
def test_count_rejections(make_pod: PodFactory, value: object, reason: str) -> None:
    problems = parse_annotations(make_pod({names.ANN_COUNT: value})).problems
    assert len(problems) == 1
    assert reason in problems[0]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "vnpu.io/chip-model is empty; name a chip model (e.g. 910B3) or remove"),
        ("910B3 ", 'vnpu.io/chip-model "910B3 " has leading or trailing whitespace'),
        ("910 B3", 'vnpu.io/chip-model "910 B3" is not a chip model name'),
        ("-910", 'vnpu.io/chip-model "-910" is not a chip model name'),
        (None, "vnpu.io/chip-model must be a string, got null"),
    ],
)
def test_chip_model_rejections(make_pod: PodFactory, value: object, reason: str) -> None:
    problems = parse_annotations(make_pod({names.ANN_CHIP_MODEL: value})).problems
    assert len(problems) == 1
    assert reason in problems[0]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "vnpu.io/containers is empty; list container names separated by commas, or remove"),
        ("  ", "vnpu.io/containers is empty"),
        ("app,,init", 'vnpu.io/containers "app,,init" has an empty entry'),
        ("app,", 'vnpu.io/containers "app," has an empty entry'),
        (["app"], 'vnpu.io/containers must be a string, got ["app"]'),
        (
            "app,ghost,spook",
            'vnpu.io/containers names "ghost", "spook", not in this pod; '
            "the pod has containers: app, side; init containers: init",
        ),
    ],
)
def test_containers_rejections(make_pod: PodFactory, value: object, reason: str) -> None:
    pod = make_pod({names.ANN_CONTAINERS: value}, ["app", "side"], init_containers=["init"])
    problems = parse_annotations(pod).problems
    assert len(problems) == 1
    assert reason in problems[0]


def test_containers_may_name_init_containers_and_dedupe(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_CONTAINERS: " init , app,init"}, ["app"], init_containers=["init"])
    assert parse_request(pod).containers == ("init", "app")


def test_containers_unmatched_when_the_pod_copy_lacks_them(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_CONTAINERS: "ghost, app,ghost"})
    assert parse_annotations(pod).problems
    parsed = parse_annotations(pod, match_containers=False)
    assert (parsed.containers, parsed.problems) == (("ghost", "app"), [])
    # Every other check still applies.
    pod = make_pod({names.ANN_CONTAINERS: "app,,x"})
    (problem,) = parse_annotations(pod, match_containers=False).problems
    assert "has an empty entry" in problem


def test_problem_keys_name_the_annotation_of_each_problem(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_CHIP_MODEL: "", names.ANN_COUNT: "9"}, template="VIR05")
    parsed = parse_annotations(pod)
    assert parsed.problem_keys == [names.ANN_TEMPLATE, names.ANN_COUNT, names.ANN_CHIP_MODEL]
    assert len(parsed.problems) == 3
    assert parse_annotations(make_pod(template=None)).problem_keys == [names.ANN_TEMPLATE]


def test_value_checks_word_problems_as_the_annotations_do(make_pod: PodFactory) -> None:
    assert template_problem("vir01") is None
    assert template_problem("VIR01") == parse_annotations(make_pod(template="VIR01")).problems[0]
    assert chip_model_problem("910B3") is None
    bad_model = parse_annotations(make_pod({names.ANN_CHIP_MODEL: "-9"})).problems[0]
    assert chip_model_problem("-9") == bad_model
    assert [count_problem(n) for n in (1, 8)] == [None, None]
    for count in (0, 9, -1):
        (expected,) = parse_annotations(make_pod({names.ANN_COUNT: str(count)})).problems
        assert count_problem(count) == expected
    assert count_problem(2.0) == (
        "vnpu.io/count must be an integer, got 2.0; expected an integer from 1 to 8"
    )
    assert count_problem(True) is not None


def test_containers_of_a_pod_without_containers(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_CONTAINERS: "app"}, containers=[])
    (problem,) = parse_annotations(pod).problems
    assert problem.endswith("the pod has no named containers")


@pytest.mark.parametrize(
    "pod",
    [
        {},
        {"metadata": None},
        {"metadata": {"annotations": ["x"]}},
        {"metadata": {"annotations": {names.ANN_TEMPLATE: "vir01"}}, "spec": "x"},
        {
            "metadata": {"annotations": {names.ANN_TEMPLATE: "vir01", names.ANN_CONTAINERS: "a"}},
            "spec": {"containers": [None, 3, {"name": 4}, {"name": "a"}], "initContainers": 7},
        },
    ],
)
def test_malformed_pods_do_not_crash(pod: dict[str, object]) -> None:
    parsed = parse_annotations(pod)
    assert isinstance(parsed.problems, list)


def test_pod_containers_keep_real_indexes(make_pod: PodFactory) -> None:
    pod = make_pod(containers=[{"image": "x"}, "app"], init_containers=["init"])
    refs = [(r.field, r.index, r.name) for r in pod_containers(pod)]
    assert refs == [("initContainers", 0, "init"), ("containers", 1, "app")]
