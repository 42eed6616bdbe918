"""The vnpu.io pod annotations, read in one place.

The webhook validates with this reading, and the operator places and counts
with it, so a pod the webhook admitted cannot be read differently later
(tests/unit/admission/test_annotation_contract.py holds the two to each other).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, TypeVar

from vnpu_common.wire import names

COUNT_MIN: Final = 1
COUNT_MAX: Final = 8

# ASCII digits only: `\d` would accept e.g. Arabic-Indic digits that int() parses.
_INTEGER_RE: Final = re.compile(r"(-?)([0-9]+)")
_CHIP_MODEL_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_QUOTE_MAX: Final = 64
_COUNT_EXPECTED: Final = f"expected an integer from {COUNT_MIN} to {COUNT_MAX}"


class AdmissionError(ValueError):
    """A pod the webhook cannot accept; `problems` holds one message per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("\n".join(self.problems))


class AnnotationError(AdmissionError):
    """The vnpu.io annotations of a pod are missing or malformed."""


@dataclass(frozen=True)
class VNPURequest:
    """What a pod asks for. `containers` None means every container and init container."""

    template: str
    count: int = 1
    chip_model: str | None = None
    containers: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ContainerRef:
    """A container of a pod and where it sits, for JSON Patch paths."""

    field: str  # "containers", "initContainers" or "ephemeralContainers"
    index: int
    name: str


@dataclass(frozen=True)
class ParsedAnnotations:
    """Each field is None when absent or malformed (count: 1), `problems` says which
    were malformed.

    Validation needs the fields that did parse (a good template is still checked
    against the cluster when the count is bad), hence not just a VNPURequest.
    """

    template: str | None = None
    count: int = 1
    chip_model: str | None = None
    containers: tuple[str, ...] | None = None
    problems: list[str] = field(default_factory=list)
    # The annotation each problem is about, in the same order.
    problem_keys: list[str] = field(default_factory=list)


def quote(value: object) -> str:
    """A bad value as it appears in a message: escaped, and cut if long."""
    if isinstance(value, str) and len(value) > _QUOTE_MAX:
        return json.dumps(value[:_QUOTE_MAX], ensure_ascii=False) + "..."
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)[:_QUOTE_MAX]


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def requests_vnpus(pod: Mapping[str, Any]) -> bool:
    """Presence of vnpu.io/template opts a pod in, whatever its value."""
    return names.ANN_TEMPLATE in pod_annotations(pod)


def pod_containers(pod: Mapping[str, Any]) -> list[ContainerRef]:
    """Init containers first, as the kubelet runs them; malformed entries skipped
    but counted, so that indexes stay those of the real lists."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return []
    refs: list[ContainerRef] = []
    for list_field in ("initContainers", "containers"):
        items = spec.get(list_field)
        if not isinstance(items, list):
            continue
        for index, item in enumerate(items):
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str):
                refs.append(ContainerRef(list_field, index, name))
    return refs


def resource_names(resources: object) -> set[str]:
    """The resource names a container's (or the pod's) `resources` asks for, in
    requests or limits; none for a malformed value."""
    if not isinstance(resources, Mapping):
        return set()
    return {
        str(key)
        for section in ("requests", "limits")
        if isinstance(resources.get(section), Mapping)
        for key in resources[section]
    }


def parse_annotations(
    pod: Mapping[str, Any], *, match_containers: bool = True
) -> ParsedAnnotations:
    """Reads every vnpu.io annotation, collecting one message per malformed value.

    `match_containers` False skips looking up the names of vnpu.io/containers
    among the pod's containers, for a copy of an admitted pod that does not
    keep them (the operator's cache): the webhook matched them at creation,
    and a pod's containers never change.
    """
    annotations = pod_annotations(pod)
    found: list[tuple[str, str]] = []  # (annotation, problem)

    template = None
    if names.ANN_TEMPLATE in annotations:
        raw = annotations[names.ANN_TEMPLATE]
        template = _collect(names.ANN_TEMPLATE, _parse_template(raw), found)
    else:
        found.append((names.ANN_TEMPLATE, f"pod has no {names.ANN_TEMPLATE} annotation"))

    count: int | None = COUNT_MIN
    if names.ANN_COUNT in annotations:
        count = _collect(names.ANN_COUNT, _parse_count(annotations[names.ANN_COUNT]), found)

    chip_model = None
    if names.ANN_CHIP_MODEL in annotations:
        raw = annotations[names.ANN_CHIP_MODEL]
        chip_model = _collect(names.ANN_CHIP_MODEL, _parse_chip_model(raw), found)

    containers = None
    if names.ANN_CONTAINERS in annotations:
        raw = annotations[names.ANN_CONTAINERS]
        present = pod_containers(pod) if match_containers else None
        containers = _collect(names.ANN_CONTAINERS, _parse_containers(raw, present), found)

    return ParsedAnnotations(
        template,
        count or COUNT_MIN,
        chip_model,
        containers,
        problems=[problem for _, problem in found],
        problem_keys=[key for key, _ in found],
    )


def parse_request(pod: Mapping[str, Any]) -> VNPURequest:
    """The pod's request; AnnotationError lists every problem if it has any."""
    parsed = parse_annotations(pod)
    if parsed.problems or parsed.template is None:
        raise AnnotationError(parsed.problems)
    return VNPURequest(parsed.template, parsed.count, parsed.chip_model, parsed.containers)


_T = TypeVar("_T")
# A parsed value, or None and the message saying why it did not parse.
_Parsed: TypeAlias = tuple[_T | None, str | None]


def template_problem(value: object) -> str | None:
    """What is wrong with `value` as a vnpu.io/template value, None if nothing;
    for requests built in code rather than read from a pod."""
    return _parse_template(value)[1]


def count_problem(value: object) -> str | None:
    """What is wrong with `value` as a number of vNPUs, in the words of the
    vnpu.io/count annotation; None if nothing."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{names.ANN_COUNT} must be an integer, got {quote(value)}; {_COUNT_EXPECTED}"
    return _parse_count(str(value))[1]


def chip_model_problem(value: object) -> str | None:
    """What is wrong with `value` as a vnpu.io/chip-model value, None if nothing."""
    return _parse_chip_model(value)[1]


def _collect(key: str, result: _Parsed[_T], found: list[tuple[str, str]]) -> _T | None:
    value, problem = result
    if problem is not None:
        found.append((key, problem))
    return value


def _as_string(key: str, raw: object) -> _Parsed[str]:
    """Shared checks: annotation values are strings without stray whitespace.
    A blank value passes as "" so that each field words its own hint."""
    if not isinstance(raw, str):
        return None, f"{key} must be a string, got {quote(raw)}"
    if not raw.strip():
        return "", None
    if raw != raw.strip():
        return None, f"{key} {quote(raw)} has leading or trailing whitespace"
    return raw, None


def _parse_template(raw: object) -> _Parsed[str]:
    key = names.ANN_TEMPLATE
    text, problem = _as_string(key, raw)
    if text is None:
        return None, problem
    if not text:
        return None, f"{key} is empty; name a template, e.g. vir05_1c_16g"
    if len(text) > names.TEMPLATE_MAX_LEN:
        return None, (
            f"{key} {quote(text)} is {len(text)} characters long; "
            f"template names have at most {names.TEMPLATE_MAX_LEN}"
        )
    if names.TEMPLATE_RE.fullmatch(text) is None:
        return None, (
            f"{key} {quote(text)} is not a valid template name: expected 'vir' and two digits, "
            "optionally followed by '_'-separated lowercase letters and digits "
            "(e.g. vir05_1c_16g, vir01)"
        )
    return text, None


def _parse_count(raw: object) -> _Parsed[int]:
    key = names.ANN_COUNT
    text, problem = _as_string(key, raw)
    if text is None:
        return None, f"{problem}; {_COUNT_EXPECTED}"
    if not text:
        return None, f"{key} is empty; {_COUNT_EXPECTED} (remove it for {COUNT_MIN})"
    match = _INTEGER_RE.fullmatch(text)
    if match is None:
        return None, f"{key} {quote(text)} is not a whole number; {_COUNT_EXPECTED}"
    sign, digits = match.groups()
    if not sign and len(digits) > 1 and digits.startswith("0"):
        return None, f"{key} {quote(text)} has a leading zero; {_COUNT_EXPECTED}"
    # Length first: int() of thousands of digits raises instead of comparing.
    if sign or len(digits) > len(str(COUNT_MAX)) or not COUNT_MIN <= int(digits) <= COUNT_MAX:
        return None, f"{key} {quote(text)} is out of range; {_COUNT_EXPECTED}"
    return int(digits), None


def _parse_chip_model(raw: object) -> _Parsed[str]:
    key = names.ANN_CHIP_MODEL
    text, problem = _as_string(key, raw)
    if text is None:
        return None, problem
    if not text:
        return None, f"{key} is empty; name a chip model (e.g. 910B3) or remove the annotation"
    if _CHIP_MODEL_RE.fullmatch(text) is None:
        return None, (
            f"{key} {quote(text)} is not a chip model name: expected up to 63 letters, "
            "digits, '.', '_' or '-', e.g. 910B3"
        )
    return text, None


def _parse_containers(raw: object, present: list[ContainerRef] | None) -> _Parsed[tuple[str, ...]]:
    """`present` None: the pod's containers are not known, names are not looked up."""
    key = names.ANN_CONTAINERS
    if not isinstance(raw, str):
        return None, f"{key} must be a string, got {quote(raw)}"
    if not raw.strip():
        return None, (
            f"{key} is empty; list container names separated by commas, "
            "or remove it to give the vNPUs to every container"
        )
    # Spaces after commas are how people write lists; they are never part of a name.
    entries = [entry.strip() for entry in raw.split(",")]
    if "" in entries:
        return None, f"{key} {quote(raw)} has an empty entry; separate container names by commas"
    wanted = tuple(dict.fromkeys(entries))  # a name listed twice means the same container
    if present is None:
        return wanted, None
    known = {ref.name for ref in present}
    missing = [name for name in wanted if name not in known]
    if missing:
        listed = ", ".join(quote(name) for name in missing)
        return None, f"{key} names {listed}, not in this pod; {_describe_containers(present)}"
    return wanted, None


def _describe_containers(present: list[ContainerRef]) -> str:
    regular = [ref.name for ref in present if ref.field == "containers"]
    init = [ref.name for ref in present if ref.field == "initContainers"]
    if not regular and not init:
        return "the pod has no named containers"
    parts = [f"containers: {', '.join(regular) or '(none)'}"]
    if init:
        parts.append(f"init containers: {', '.join(init)}")
    return "the pod has " + "; ".join(parts)
