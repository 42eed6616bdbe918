"""The admission verdicts: what the mutating and validating webhooks answer
for one pod, and why a refusal is refused (the DENIED_* codes). Pure: the
HTTP side (admission.webhook) decodes the review and encodes the answer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from vnpu_common.wire import names
from vnpu_operator.admission.charges import Charge, charge_for
from vnpu_operator.admission.limits import (
    LimitsRequest,
    Path,
    Routing,
    annotate,
    annotation_problems,
    dra_problems,
    limits_request,
    route,
    steer_ops,
)
from vnpu_operator.admission.mutation import JsonPatchOp, mutate_pod
from vnpu_operator.admission.offered import OfferedTemplates
from vnpu_operator.admission.validation import dra_extended_resource_problems, validate_pod
from vnpu_operator.annotations import (
    AdmissionError,
    parse_request,
    pod_annotations,
    requests_vnpus,
)

NOT_SYNCED: Final = (
    "the vnpu-operator has not yet read the cluster's chips (it is starting); "
    "create the pod again in a few seconds"
)

# Why a pod was refused, as a metric label: a few stable codes, never the
# message (which names the pod's own values).
DENIED_NOT_SYNCED: Final = "not-synced"
DENIED_INVALID: Final = "invalid-request"
DENIED_NO_CHARGE: Final = "no-charge"
DENIED_OVER_QUOTA: Final = "over-quota"
DENIED_NOT_MUTATED: Final = "not-mutated"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    problems: list[str] = field(default_factory=list)
    patch: list[JsonPatchOp] = field(default_factory=list)
    # One of the DENIED_* codes when not allowed.
    reason: str = ""


OverQuota = Callable[[Charge], str | None]


def _no_quota(_: Charge) -> str | None:
    return None


NO_ROUTING: Final = Routing()


def decide_mutation(
    pod: Mapping[str, Any],
    offered: OfferedTemplates | None,
    runtime_class_name: str = "",
    over_quota: OverQuota = _no_quota,
    routing: Routing = NO_ROUTING,
) -> Decision:
    """Rejects here already, with the same messages as the validating webhook:
    the mutating webhook runs first, and a patch of a bad pod would be wasted.
    A pod asking vnpu.io/<template> in its resources (and not by annotation)
    goes the way `routing` and the cluster's offer say (admission.limits)."""
    if not requests_vnpus(pod):
        asked = limits_request(pod)
        if asked is None:
            return Decision(allowed=True)
        return _decide_limits(pod, asked, offered, runtime_class_name, over_quota, routing)
    if offered is None:
        # Without the chips' templates there is no charge, and a pod admitted
        # uncharged would escape its namespace's quota for its whole life.
        return Decision(allowed=False, problems=[NOT_SYNCED], reason=DENIED_NOT_SYNCED)
    problems = validate_pod(pod, offered)
    if problems:
        return Decision(allowed=False, problems=problems, reason=DENIED_INVALID)
    request = parse_request(pod)
    charge = charge_for(request.template, request.count, request.chip_model, offered)
    if isinstance(charge, str):
        return Decision(allowed=False, problems=[charge], reason=DENIED_NO_CHARGE)
    refusal = over_quota(charge)
    if refusal is not None:
        return Decision(allowed=False, problems=[refusal], reason=DENIED_OVER_QUOTA)
    try:
        return Decision(allowed=True, patch=mutate_pod(pod, runtime_class_name, charge))
    except AdmissionError as exc:
        return Decision(allowed=False, problems=list(exc.problems), reason=DENIED_INVALID)


def _decide_limits(
    pod: Mapping[str, Any],
    asked: LimitsRequest,
    offered: OfferedTemplates | None,
    runtime_class_name: str,
    over_quota: OverQuota,
    routing: Routing,
) -> Decision:
    if offered is None:
        return Decision(allowed=False, problems=[NOT_SYNCED], reason=DENIED_NOT_SYNCED)
    chip_model = names.ANN_CHIP_MODEL in pod_annotations(pod)
    if route(asked, offered, routing, chip_model=chip_model) is Path.DRA:
        # The scheduler's claim is served like any claim; quota counts the
        # request itself, so there is no charge to write.
        problems = dra_problems(pod, asked) + dra_extended_resource_problems(pod)
        ops, clashes = steer_ops(pod, routing.dra_node_selector)
        if problems or clashes:
            return Decision(allowed=False, problems=problems + clashes, reason=DENIED_INVALID)
        return Decision(allowed=True, patch=ops)
    problems = annotation_problems(asked)
    if problems:
        return Decision(allowed=False, problems=problems, reason=DENIED_INVALID)
    annotated, op = annotate(pod, asked)
    verdict = decide_mutation(annotated, offered, runtime_class_name, over_quota)
    if not verdict.allowed:
        return verdict
    return Decision(allowed=True, patch=[op, *verdict.patch])


def decide_validation(
    pod: Mapping[str, Any],
    offered: OfferedTemplates | None,
    runtime_class_name: str = "",
    over_quota: OverQuota = _no_quota,
    routing: Routing = NO_ROUTING,
) -> Decision:
    """Also requires the mutation to be in place: a pod without the gate could
    start before its vNPUs exist (another webhook may have undone ours). The
    same checks as the mutation; a patch it would still make is what is missing."""
    verdict = decide_mutation(pod, offered, runtime_class_name, over_quota, routing)
    missing = verdict.patch
    if not verdict.allowed:
        return verdict
    if missing:
        paths = ", ".join(dict.fromkeys(op["path"] for op in missing))
        return Decision(
            allowed=False,
            problems=[
                f"the pod lacks what webhook {names.WEBHOOK_MUTATE_NAME} adds (scheduling gate, "
                f"finalizer, env, vNPU resource requests) at {paths}; is "
                "MutatingWebhookConfiguration "
                f"{names.WEBHOOK_CONFIG_NAME} installed, or did a later webhook undo it?"
            ],
            reason=DENIED_NOT_MUTATED,
        )
    return Decision(allowed=True)
