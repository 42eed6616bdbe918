"""The webhook and the operator read the vnpu.io pod annotations alike.

Each pod of one table goes through the real admission path (an AdmissionReview
of its CREATE to /mutate, the patch applied, the patched pod to /validate, as
the API server does) and through what the operator reads of the pod the API
server stores: `PodRequest.from_pod` of the pod and of the operator's slim
cached copy, and `lifecycle.requested_count`. What the webhook admits, the
operator reads as admitted and never refuses; what the webhook refuses,
`from_pod` refuses with the same messages.

Every well-formed template and chip model in the table is offered by the
catalog below, so the webhook's verdicts are about the annotations alone.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass
from typing import Any, Final

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer

from localplane.pods import vnpu_pod
from vnpu_common.wire import names
from vnpu_operator.admission import OfferedTemplates, create_app
from vnpu_operator.lifecycle import requested_count
from vnpu_operator.placement import InvalidRequestError, PodRequest
from vnpu_operator.slim import slim_pod

T: Final = names.ANN_TEMPLATE
N: Final = names.ANN_COUNT
M: Final = names.ANN_CHIP_MODEL
C: Final = names.ANN_CONTAINERS
ANNOTATIONS_READ: Final = (T, N, M, C)

LONG_TEMPLATE: Final = "vir05_" + "a" * 25  # 31 characters, the most a driver prints
LONG_MODEL: Final = "M" + "x" * 62  # 63 characters, the most a chip model may have
ODD_MODEL: Final = "Ascend-910.B_3"
OFFERED: Final = OfferedTemplates.of_sizes(
    {
        "910B3": {
            "vir05_1c_16g": (5, 16384),
            "vir10_3c_32g": (10, 32768),
            LONG_TEMPLATE: (5, 16384),
        },
        "310P3": {"vir01": (1, 3072), "vir02": (2, 6144)},
        ODD_MODEL: {"vir05_1c_16g": (5, 16384)},
        LONG_MODEL: {"vir01": (1, 3072)},
    }
)
UID: Final = "4a4b6e0c-9d7e-4a57-8a43-2f0d4f1c0b11"
_ABSENT: Final = object()


@dataclass(frozen=True)
class Admit:
    """The webhook admits the pod, asking for this."""

    template: str = "vir05_1c_16g"
    count: int = 1
    chip_model: str | None = None
    containers: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Refuse:
    """The webhook refuses the pod with a message containing `says`; the
    lifecycle counts `count` vNPUs for it (1 when vnpu.io/count is malformed)."""

    says: str
    count: int = 1


@dataclass(frozen=True)
class NotOurs:
    """No vnpu.io/template: the webhooks let the pod pass untouched."""


Expectation = Admit | Refuse | NotOurs


def case(
    case_id: str,
    annotations: dict[str, Any],
    expect: Expectation,
    *,
    containers: tuple[str, ...] = ("app",),
    init: tuple[str, ...] = (),
) -> Any:
    """A pod asking for vir05_1c_16g unless `annotations` say otherwise
    (`_ABSENT` removes an annotation)."""
    merged = {T: "vir05_1c_16g", **annotations}
    merged = {key: value for key, value in merged.items() if value is not _ABSENT}
    return pytest.param(merged, containers, init, expect, id=case_id)


CASES: Final = [
    # Admitted.
    case("template-only", {}, Admit()),
    case(
        "every-annotation",
        {N: "8", M: "910B3", C: "app"},
        Admit(count=8, chip_model="910B3", containers=("app",)),
    ),
    case("count-lower-bound", {N: "1"}, Admit(count=1)),
    case("count-upper-bound", {N: "8"}, Admit(count=8)),
    case("count-3", {N: "3"}, Admit(count=3)),
    case("template-31-chars", {T: LONG_TEMPLATE}, Admit(template=LONG_TEMPLATE)),
    case(
        "310P3-template",
        {T: "vir01", N: "2", M: "310P3"},
        Admit(template="vir01", count=2, chip_model="310P3"),
    ),
    case("chip-model-dot-dash-underscore", {M: ODD_MODEL}, Admit(chip_model=ODD_MODEL)),
    case(
        "chip-model-63-chars",
        {T: "vir01", M: LONG_MODEL},
        Admit(template="vir01", chip_model=LONG_MODEL),
    ),
    case(
        "containers-spaced-and-repeated",
        {C: "init , app,init"},
        Admit(containers=("init", "app")),
        init=("init",),
    ),
    case(
        "containers-tabs-and-newlines",
        {C: "\tapp ,\ninit "},
        Admit(containers=("app", "init")),
        init=("init",),
    ),
    case("containers-repeated", {C: "app,app"}, Admit(containers=("app",))),
    case("containers-init-only", {C: "init"}, Admit(containers=("init",)), init=("init",)),
    case(
        "containers-one-of-two",
        {C: "side"},
        Admit(containers=("side",)),
        containers=("app", "side"),
    ),
    case("other-vnpu-annotation", {"vnpu.io/other": "x"}, Admit()),
    case("other-annotation-not-a-string", {"example.com/n": 5}, Admit()),
    # The webhook removes a user's visible-devices; the operator reads the pod without it.
    case("user-visible-devices", {names.ANN_VISIBLE_DEVICES: "0"}, Admit()),
    # Not asking for vNPUs.
    case("no-template", {T: _ABSENT, N: "08", C: "ghost"}, NotOurs()),
    # vnpu.io/template refused.
    case("template-empty", {T: ""}, Refuse("vnpu.io/template is empty")),
    case("template-leading-space", {T: " vir01"}, Refuse("leading or trailing whitespace")),
    case("template-trailing-newline", {T: "vir01\n"}, Refuse("leading or trailing whitespace")),
    case("template-upper-case", {T: "VIR05"}, Refuse("is not a valid template name")),
    case("template-one-digit", {T: "vir5"}, Refuse("is not a valid template name")),
    case("template-trailing-underscore", {T: "vir05_"}, Refuse("is not a valid template name")),
    case("template-arabic-digits", {T: "vir\u0660\u0665"}, Refuse("not a valid template name")),
    case("template-fullwidth", {T: "\uff56ir05"}, Refuse("is not a valid template name")),
    case("template-accented", {T: "vir05_1c_16g\u00e9"}, Refuse("not a valid template name")),
    case("template-32-chars", {T: LONG_TEMPLATE + "a"}, Refuse("is 32 characters long")),
    case("template-very-long", {T: "x" * 10_000}, Refuse("is 10000 characters long")),
    case("template-number", {T: 5}, Refuse("vnpu.io/template must be a string, got 5")),
    case("template-null", {T: None}, Refuse("vnpu.io/template must be a string, got null")),
    case("template-bad-count-good", {T: "VIR05", N: "2"}, Refuse("not a valid", count=2)),
    # vnpu.io/count refused.
    case("count-leading-zero", {N: "08"}, Refuse('vnpu.io/count "08" has a leading zero')),
    case("count-double-zero", {N: "00"}, Refuse("has a leading zero")),
    case("count-zero", {N: "0"}, Refuse('vnpu.io/count "0" is out of range')),
    case("count-9", {N: "9"}, Refuse('vnpu.io/count "9" is out of range')),
    case("count-10", {N: "10"}, Refuse("is out of range")),
    case("count-negative", {N: "-1"}, Refuse("is out of range")),
    case("count-negative-zero", {N: "-0"}, Refuse("is out of range")),
    case("count-plus-sign", {N: "+2"}, Refuse("is not a whole number")),
    case("count-decimal", {N: "2.0"}, Refuse("is not a whole number")),
    case("count-underscore", {N: "1_0"}, Refuse("is not a whole number")),
    case("count-word", {N: "two"}, Refuse("is not a whole number")),
    case("count-arabic-digit", {N: "\u0662"}, Refuse("is not a whole number")),
    case("count-fullwidth-digit", {N: "\uff18"}, Refuse("is not a whole number")),
    case("count-superscript", {N: "\u00b2"}, Refuse("is not a whole number")),
    case("count-leading-space", {N: " 2"}, Refuse("leading or trailing whitespace")),
    case("count-trailing-space", {N: "2 "}, Refuse("leading or trailing whitespace")),
    case("count-empty", {N: ""}, Refuse("vnpu.io/count is empty")),
    case("count-very-long", {N: "9" * 5000}, Refuse("is out of range")),
    case("count-number", {N: 2}, Refuse("vnpu.io/count must be a string, got 2")),
    case("count-boolean", {N: True}, Refuse("vnpu.io/count must be a string, got true")),
    case("count-null", {N: None}, Refuse("vnpu.io/count must be a string, got null")),
    # vnpu.io/chip-model refused.
    case("chip-model-empty", {M: ""}, Refuse("vnpu.io/chip-model is empty")),
    case("chip-model-trailing-space", {M: "910B3 "}, Refuse("leading or trailing whitespace")),
    case("chip-model-inner-space", {M: "910 B3"}, Refuse("is not a chip model name")),
    case("chip-model-leading-dash", {M: "-910"}, Refuse("is not a chip model name")),
    case("chip-model-fullwidth", {M: "\uff19\uff11\uff10B3"}, Refuse("not a chip model name")),
    case("chip-model-unicode-letter", {M: "910B\u00df"}, Refuse("not a chip model name")),
    case("chip-model-64-chars", {M: LONG_MODEL + "x"}, Refuse("is not a chip model name")),
    case("chip-model-very-long", {M: "A" * 10_000}, Refuse("is not a chip model name")),
    case("chip-model-number", {M: 910}, Refuse("vnpu.io/chip-model must be a string")),
    case("chip-model-null", {M: None}, Refuse("vnpu.io/chip-model must be a string")),
    # vnpu.io/containers refused.
    case("containers-empty", {C: ""}, Refuse("vnpu.io/containers is empty")),
    case("containers-blank", {C: "  "}, Refuse("vnpu.io/containers is empty")),
    case("containers-empty-entry", {C: "app,,init"}, Refuse("has an empty entry"), init=("init",)),
    case("containers-trailing-comma", {C: "app,"}, Refuse("has an empty entry")),
    case("containers-leading-comma", {C: ",app"}, Refuse("has an empty entry")),
    case("containers-unknown", {C: "ghost"}, Refuse('names "ghost", not in this pod')),
    case("containers-wrong-case", {C: "App"}, Refuse('names "App", not in this pod')),
    case("containers-cyrillic", {C: "\u0430pp"}, Refuse("not in this pod")),
    case("containers-init-absent", {C: "init"}, Refuse('names "init", not in this pod')),
    case("containers-very-long", {C: "a" * 10_000}, Refuse("not in this pod")),
    case("containers-list", {C: ["app"]}, Refuse("vnpu.io/containers must be a string")),
    # Several problems at once: every one is reported, by both.
    case(
        "several-problems",
        {T: "VIR05", N: "9", C: "ghost"},
        Refuse('vnpu.io/count "9" is out of range'),
    ),
]


def build_pod(
    annotations: dict[str, Any], containers: tuple[str, ...], init: tuple[str, ...]
) -> dict[str, Any]:
    """A pod as a CREATE's AdmissionReview carries it: no uid yet."""
    return vnpu_pod(
        "train-0",
        "ml",
        template=None,
        annotations=annotations,
        containers=containers,
        init_containers=init,
    )


def stored(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it once every webhook admitted it."""
    out = copy.deepcopy(pod)
    out["metadata"]["uid"] = UID
    return out


async def _review(client: TestClient[Any, Any], path: str, pod: dict[str, Any]) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": pod,
        },
    }
    resp = await client.post(path, json=review)
    assert resp.status == 200, await resp.text()
    response: dict[str, Any] = (await resp.json())["response"]
    return response


async def admission(pod: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The pod as stored after both webhooks admitted it, or None and the denial."""
    async with TestClient(TestServer(create_app(lambda: OFFERED))) as client:
        mutated = await _review(client, names.WEBHOOK_MUTATE_PATH, pod)
        if not mutated["allowed"]:
            return None, str(mutated["status"]["message"])
        if "patch" in mutated:
            ops = json.loads(base64.b64decode(mutated["patch"]))
            pod = jsonpatch.apply_patch(pod, ops)
        validated = await _review(client, names.WEBHOOK_VALIDATE_PATH, pod)
        if not validated["allowed"]:
            return None, str(validated["status"]["message"])
    return stored(pod), ""


def given_vnpus(pod: dict[str, Any]) -> set[str]:
    """The containers whose env the webhook pointed at the pod's vNPUs."""
    spec = pod["spec"]
    return {
        container["name"]
        for container in spec.get("initContainers", []) + spec["containers"]
        if any(
            e.get("name") == names.ENV_VISIBLE_DEVICES and "valueFrom" in e
            for e in container.get("env", [])
        )
    }


@pytest.mark.parametrize(("annotations", "containers", "init", "expect"), CASES)
async def test_the_operator_reads_a_pod_as_the_webhook_admitted_it(
    annotations: dict[str, Any],
    containers: tuple[str, ...],
    init: tuple[str, ...],
    expect: Expectation,
) -> None:
    pod = build_pod(annotations, containers, init)
    admitted, denial = await admission(pod)

    if isinstance(expect, NotOurs):
        assert admitted == stored(pod), "the webhooks changed a pod that asks for no vNPUs"
        with pytest.raises(InvalidRequestError) as info:
            PodRequest.from_pod(admitted)
        assert info.value.field == T
        return

    if isinstance(expect, Refuse):
        assert admitted is None, "the webhook admitted a pod it should refuse"
        assert expect.says in denial
        # Had the pod been stored after all (the webhook bypassed), placement refuses it too.
        with pytest.raises(InvalidRequestError) as info:
            PodRequest.from_pod(stored(pod))
        assert str(info.value).split("\n") == denial.split("\n")
        assert info.value.field in ANNOTATIONS_READ
        assert requested_count(stored(pod)) == expect.count
        return

    assert admitted is not None, f"the webhook refused: {denial}"
    everyone = set(init) | set(containers)
    assert given_vnpus(admitted) == set(expect.containers or everyone)
    # The operator's cache keeps slim copies; they must read the same.
    for copy_read in (admitted, slim_pod(admitted)):
        request = PodRequest.from_pod(copy_read)
        read = (request.template, request.count, request.chip_model, request.containers)
        assert read == (expect.template, expect.count, expect.chip_model, expect.containers)
        assert requested_count(copy_read) == expect.count
