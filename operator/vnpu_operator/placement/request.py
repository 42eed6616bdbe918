"""What a pod asks for: its vNPU annotations and its scheduling directives."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from vnpu_operator import names
from vnpu_operator.placement.errors import InvalidRequestError
from vnpu_operator.placement.selectors import (
    SelectorError,
    Term,
    Toleration,
    compile_node_selector,
    compile_tolerations,
)

MIN_COUNT: Final = 1
MAX_COUNT: Final = 8

_TEMPLATE = re.compile(names.TEMPLATE_PATTERN)
_COUNT = re.compile(r"[0-9]{1,3}")
_CHIP_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_AFFINITY_PATH = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def _check_template(value: str) -> None:
    if len(value) > names.TEMPLATE_MAX_LEN or not _TEMPLATE.fullmatch(value):
        raise InvalidRequestError(
            names.ANN_TEMPLATE, f"{value!r} is not a vNPU template name (e.g. vir05_1c_16g)"
        )


def _check_count(count: int) -> None:
    if not MIN_COUNT <= count <= MAX_COUNT:
        raise InvalidRequestError(
            names.ANN_COUNT, f"{count} is out of range {MIN_COUNT}..{MAX_COUNT}"
        )


@dataclass(frozen=True)
class VNPURequest:
    """The vNPU annotations of a pod, validated; needs no pod identity, so the
    admission webhook can use it before the pod has a name or UID."""

    template: str
    count: int = 1
    chip_model: str | None = None
    containers: tuple[str, ...] | None = None


def parse_annotations(annotations: Any) -> VNPURequest | None:
    """None when the pod does not opt in (no template annotation)."""
    if annotations is None:
        return None
    if not isinstance(annotations, Mapping):
        raise InvalidRequestError("metadata.annotations", "must be a map of strings")
    raw_template = annotations.get(names.ANN_TEMPLATE)
    if raw_template is None:
        return None
    known = (names.ANN_TEMPLATE, names.ANN_COUNT, names.ANN_CHIP_MODEL, names.ANN_CONTAINERS)
    for key in known:
        if key in annotations and not isinstance(annotations[key], str):
            raise InvalidRequestError(key, "must be a string")
    template = str(raw_template)
    _check_template(template)

    raw_count = annotations.get(names.ANN_COUNT)
    count = 1
    if raw_count is not None:
        if not _COUNT.fullmatch(raw_count):
            raise InvalidRequestError(
                names.ANN_COUNT, f"{raw_count!r} is not an integer {MIN_COUNT}..{MAX_COUNT}"
            )
        count = int(raw_count)
        _check_count(count)

    chip_model = annotations.get(names.ANN_CHIP_MODEL)
    if chip_model is not None and not _CHIP_MODEL.fullmatch(chip_model):
        raise InvalidRequestError(
            names.ANN_CHIP_MODEL, f"{chip_model!r} is not a chip model (e.g. 910B3)"
        )

    containers: tuple[str, ...] | None = None
    raw_containers = annotations.get(names.ANN_CONTAINERS)
    if raw_containers is not None:
        items = [c.strip() for c in raw_containers.split(",")]
        bad = [c for c in items if not _DNS_LABEL.fullmatch(c)]
        if bad:
            raise InvalidRequestError(
                names.ANN_CONTAINERS, f"{bad[0]!r} is not a container name (comma list expected)"
            )
        if len(set(items)) != len(items):
            raise InvalidRequestError(names.ANN_CONTAINERS, "lists a container twice")
        containers = tuple(items)
    return VNPURequest(template=template, count=count, chip_model=chip_model, containers=containers)


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
        _check_template(self.template)
        _check_count(self.count)
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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodRequest:
        """Reads a raw pod (API JSON). Raises InvalidRequestError when the pod
        does not request vNPUs or any part of the request is malformed."""
        if not isinstance(pod, Mapping):
            raise InvalidRequestError("pod", "must be an object")
        request = parse_annotations(_get(pod, "metadata", "annotations"))
        if request is None:
            raise InvalidRequestError(names.ANN_TEMPLATE, "missing: the pod requests no vNPUs")
        tolerations = _get(pod, "spec", "tolerations")
        if tolerations is not None and not isinstance(tolerations, list):
            raise InvalidRequestError("spec.tolerations", "must be a list")
        affinity = _get(pod, "spec", "affinity", "nodeAffinity")
        required = _get(affinity, "requiredDuringSchedulingIgnoredDuringExecution")
        selector = _get(pod, "spec", "nodeSelector")
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
        )
