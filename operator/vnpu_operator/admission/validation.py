"""Admission checks of a pod that asks for vNPUs: one message per problem."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vnpu_common import names
from vnpu_operator.admission.offered import OfferedTemplates
from vnpu_operator.annotations import parse_annotations, quote, requests_vnpus


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
