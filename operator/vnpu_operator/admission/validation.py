"""Admission checks of a pod that asks for vNPUs: one message per problem."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vnpu_common.wire import names
from vnpu_operator.admission.offered import OfferedTemplates
from vnpu_operator.annotations import parse_annotations, quote, requests_vnpus, resource_names


def validate_pod(pod: Mapping[str, Any], offered: OfferedTemplates | None) -> list[str]:
    """Problems of `pod`; empty means admit. Pods without vnpu.io/template are
    not ours and pass. `offered` None means the inventory is not known yet: the
    checks against the cluster are skipped rather than rejecting every pod while
    the operator starts (placement keeps such a pod gated if nothing fits)."""
    if not requests_vnpus(pod):
        return []
    parsed = parse_annotations(pod)
    problems = list(parsed.problems)
    problems += _node_name_problems(pod)
    problems += dra_extended_resource_problems(pod)
    if offered is not None:
        problems += _chip_model_problems(parsed.chip_model, offered)
        problems += _template_problems(parsed.template, parsed.chip_model, offered)
    return problems


def _node_name_problems(pod: Mapping[str, Any]) -> list[str]:
    # The API server forbids scheduling gates on a pod bound at creation; say why
    # in our words instead of letting the gate patch fail obscurely.
    spec = pod.get("spec")
    node_name = spec.get("nodeName") if isinstance(spec, dict) else None
    if not node_name:
        return []
    return [
        f"{names.ANN_TEMPLATE} cannot be used with spec.nodeName ({quote(node_name)}): "
        "the operator picks the node; use a nodeSelector or node affinity instead"
    ]


# Every DeviceClass is also an extended resource of this name (KEP-5004, GA in 1.37): a pod
# asking for it gets a DRA device the scheduler allocates, with no claim of its own.
IMPLICIT_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
DRA_EXTENDED_RESOURCE: Final = f"{IMPLICIT_PREFIX}{names.DRA_DEVICE_CLASS}"


def is_vnpu_class_resource(key: str) -> bool:
    """The implicit name of the chart's DeviceClass vnpu.io or of a per-template
    one (<template>.vnpu.io): a quota on requests.vnpu.io/<template> does not
    count it, so only vnpu.io/<template> is served."""
    if not key.startswith(IMPLICIT_PREFIX):
        return False
    device_class = key[len(IMPLICIT_PREFIX) :]
    return device_class == names.DRA_DEVICE_CLASS or device_class.endswith(f".{names.GROUP}")


def dra_extended_resource_problems(pod: Mapping[str, Any]) -> list[str]:
    """A pod asking for the vNPU DeviceClass as an extended resource, in a container's or init
    container's requests or limits, or in its pod-level resources: not supported (quota on
    requests.vnpu.io/vnpus does not count it; an annotated pod would get a second vNPU by
    DRA). The chart's dra-extended-resource policy refuses it on every pod; this is the same
    refusal for a pod that reaches the webhook, in the same words."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    places = [
        (f"{kind} {container.get('name')}", container.get("resources"))
        for kind, key in (("container", "containers"), ("init container", "initContainers"))
        for container in _mappings(spec.get(key))
    ]
    places.append(("pod", spec.get("resources")))
    where: list[str] = []
    named: set[str] = set()
    for place, resources in places:
        found = {k for k in resource_names(resources) if is_vnpu_class_resource(k)}
        if found:
            where.append(place)
            named |= found
    if not where:
        return []
    return [
        f"{', '.join(where)}: resources {', '.join(sorted(named))} (a DeviceClass as an "
        "extended resource) are not supported for vNPUs: such a request is not counted by a "
        f"quota on requests.{names.RES_VNPUS} or requests.{names.RESOURCE_PREFIX}<template>. "
        f"Ask for vNPUs with {names.RESOURCE_PREFIX}<template> in limits (e.g. "
        f"{names.template_resource('vir05_1c_16g')}: 1), the {names.ANN_TEMPLATE} annotation, "
        "or a ResourceClaim of DeviceClass "
        f"{names.DRA_DEVICE_CLASS} (docs/USAGE.md, docs/DRA.md)"
    ]


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _chip_model_problems(chip_model: str | None, offered: OfferedTemplates) -> list[str]:
    if chip_model is None or offered.empty or chip_model in offered.by_model:
        return []
    hint = ""
    same = [m for m in offered.models() if m.casefold() == chip_model.casefold()]
    if same:
        hint = f" (did you mean {same[0]}?)"
    return [
        f"{names.ANN_CHIP_MODEL} {quote(chip_model)} is not a chip model of this cluster{hint}; "
        f"known models: {', '.join(offered.models())}"
    ]


def _template_problems(
    template: str | None, chip_model: str | None, offered: OfferedTemplates
) -> list[str]:
    if template is None:
        return []
    key = names.ANN_TEMPLATE
    if offered.empty:
        return [
            f"{key} {quote(template)} is not offered by any node: the cluster offers no vNPU "
            "templates yet (no VNPUNode reports a chip)"
        ]
    if not offered.offers(template):
        return [
            f"{key} {quote(template)} is not offered by any node; offered: {offered.describe()}"
        ]
    # An unknown chip model has its own message; no second one about the template.
    if chip_model in offered.by_model and not offered.offers(template, chip_model):
        return [
            f"{key} {quote(template)} is not offered by chip model {quote(chip_model)} "
            f"({names.ANN_CHIP_MODEL}); {offered.describe(chip_model)}; {template} is "
            f"offered by: {', '.join(offered.models_offering(template))}"
        ]
    return []
