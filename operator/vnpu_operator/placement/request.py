"""What a pod asks for: its vNPU annotations and its scheduling directives.

The annotations are read by vnpu_operator.annotations, the webhook's reading,
so that placement never reads a pod otherwise than it was admitted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from vnpu_common.wire import names
from vnpu_operator.annotations import (
    chip_model_problem,
    count_problem,
    parse_annotations,
    template_problem,
)
from vnpu_operator.placement.errors import InvalidRequestError
from vnpu_operator.placement.model import ChargedSize
from vnpu_operator.placement.selectors import (
    SelectorError,
    Term,
    Toleration,
    compile_node_selector,
    compile_tolerations,
)
from vnpu_operator.slim import charged_requests

_AFFINITY_PATH = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def _check(key: str, problem: str | None) -> None:
    if problem is not None:
        raise InvalidRequestError(key, problem, named=True)


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if obj is None:
            return None
        if not isinstance(obj, Mapping):
            raise InvalidRequestError(".".join(path), "must be an object")
        obj = obj.get(key)
    return obj


@dataclass(frozen=True)
class PodRequest:
    """One pod's request as the placement engine sees it.

    The scheduling directives are kept raw (as the pod carries them) and
    compiled at construction, so a malformed one is rejected here with a
    typed error instead of failing in the middle of a placement.
    """

    namespace: str
    name: str
    uid: str
    template: str
    count: int = 1
    chip_model: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_affinity: Mapping[str, Any] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    # vnpu.io/containers as admitted (None: every container). Placement does
    # not read it; it is the pod's whole request, as the webhook read it.
    containers: tuple[str, ...] | None = None
    # spec.priority, which the API server's Priority admission fills from the
    # pod's PriorityClass (absent: 0). Placement reads it only where a
    # preempting pod holds capacity (vnpu_operator.placement.preemption).
    priority: int = 0
    # What one vNPU was charged at admission (the webhook's vnpu.io/* requests
    # over the count); None for a pod charged nothing. Only vNPUs of that size
    # are booked for it.
    charged: ChargedSize | None = None
    affinity_terms: tuple[Term, ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    compiled_tolerations: tuple[Toleration, ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for attr in ("namespace", "name", "uid"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr):
                raise InvalidRequestError(f"metadata.{attr}", "must be a non-empty string")
        # Requests built in code get the annotations' checks; from_pod's have passed them.
        _check(names.ANN_TEMPLATE, template_problem(self.template))
        _check(names.ANN_COUNT, count_problem(self.count))
        if self.chip_model is not None:
            _check(names.ANN_CHIP_MODEL, chip_model_problem(self.chip_model))
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise InvalidRequestError("spec.priority", "must be an integer")
        if not isinstance(self.node_selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.node_selector.items()
        ):
            raise InvalidRequestError("spec.nodeSelector", "must be a map of strings")
        try:
            terms = (
                None
                if self.required_affinity is None
                else compile_node_selector(self.required_affinity, _AFFINITY_PATH)
            )
            tolerations = compile_tolerations(list(self.tolerations), "spec.tolerations")
        except SelectorError as err:
            raise InvalidRequestError(err.where, str(err)) from err
        # Frozen dataclass: the compiled forms are derived once, here.
        object.__setattr__(self, "affinity_terms", terms)
        object.__setattr__(self, "compiled_tolerations", tolerations)

    @cached_property
    def where(self) -> str:
        """What the node filter reads of the pod (selector, required node
        affinity, tolerations) as one string: requests that may go to the
        same nodes have the same one, whatever their maps' key order."""
        return json.dumps(
            [dict(self.node_selector), self.required_affinity, list(self.tolerations)],
            sort_keys=True,
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodRequest:
        """Reads a raw pod (API JSON). Raises InvalidRequestError when the pod
        does not request vNPUs or any part of the request is malformed; for
        the annotations, with the webhook's messages, one line each."""
        if not isinstance(pod, Mapping):
            raise InvalidRequestError("pod", "must be an object")
        spec = _get(pod, "spec")
        # The operator caches pods without their containers (vnpu_operator.slim):
        # the webhook matched vnpu.io/containers against them, and they never change.
        has_containers = isinstance(spec, Mapping) and "containers" in spec
        request = parse_annotations(pod, match_containers=has_containers)
        if request.problems or request.template is None:
            problem_key = request.problem_keys[0] if request.problem_keys else names.ANN_TEMPLATE
            raise InvalidRequestError(problem_key, "\n".join(request.problems), named=True)
        tolerations = _get(pod, "spec", "tolerations")
        if tolerations is not None and not isinstance(tolerations, list):
            raise InvalidRequestError("spec.tolerations", "must be a list")
        affinity = _get(pod, "spec", "affinity", "nodeAffinity")
        required = _get(affinity, "requiredDuringSchedulingIgnoredDuringExecution")
        selector = _get(pod, "spec", "nodeSelector")
        priority = _get(pod, "spec", "priority")
        return cls(
            namespace=_get(pod, "metadata", "namespace"),
            name=_get(pod, "metadata", "name"),
            uid=_get(pod, "metadata", "uid"),
            template=request.template,
            count=request.count,
            chip_model=request.chip_model,
            node_selector={} if selector is None else selector,
            required_affinity=required,
            tolerations=tuple(tolerations or ()),
            containers=request.containers,
            priority=0 if priority is None else priority,
            charged=charged_size(charged_requests(pod), request.count),
        )


def charged_size(requests: Mapping[str, int], count: int) -> ChargedSize | None:
    """One vNPU's share of the pod's charge (`requests`: resource -> amount,
    slim.charged_requests); None when it was charged neither AICore nor memory."""
    each: dict[str, int | None] = {}
    for resource in (names.RES_AICORE, names.RES_MEMORY_MB):
        total = requests.get(resource)
        if total is not None and total % count:
            raise InvalidRequestError(
                f"resources {resource}",
                f"{total} is not {count} times one vNPU's size: not the charge the "
                "vnpu-operator's webhook writes (delete the pod and create it anew)",
            )
        each[resource] = None if total is None else total // count
    if each[names.RES_AICORE] is None and each[names.RES_MEMORY_MB] is None:
        return None
    return ChargedSize(aicore=each[names.RES_AICORE], memory_mb=each[names.RES_MEMORY_MB])
