"""Kubernetes node-selection semantics: nodeSelector, required node affinity,
taints and tolerations.

Raw dicts are compiled once into small typed values so that malformed input
surfaces as a typed error where it is read, and matching itself cannot fail.
The rules mirror kube-scheduler's (k8s.io/component-helpers nodeaffinity and
core/v1 ToleratesTaint), so a pod lands where the default scheduler would
also let it run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_FIELD_OPERATORS = frozenset({"In", "NotIn"})
_FIELD_NODE_NAME = "metadata.name"
# strconv.ParseInt(v, 10, 64) accepts an optional sign and decimal digits only.
_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})
# PreferNoSchedule is a preference only; the scheduler still places there.
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class SelectorError(ValueError):
    """Malformed selector, toleration or taint; `where` locates it."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


# --------------------------------------------------------------------------
# Node affinity


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Term:
    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]


def _parse_int(value: str) -> int | None:
    if not _INT.fullmatch(value):
        return None
    number = int(value)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _str_list(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise SelectorError(where, "must be a list of strings")
    return tuple(raw)


def _requirement(raw: Any, where: str, *, field: bool) -> Requirement:
    if not isinstance(raw, Mapping):
        raise SelectorError(where, "must be an object")
    key, operator = raw.get("key"), raw.get("operator")
    if not isinstance(key, str) or not key:
        raise SelectorError(f"{where}.key", "must be a non-empty string")
    allowed = _FIELD_OPERATORS if field else _OPERATORS
    if operator not in allowed:
        raise SelectorError(f"{where}.operator", f"must be one of {', '.join(sorted(allowed))}")
    values = _str_list(raw.get("values"), f"{where}.values")
    if field:
        if key != _FIELD_NODE_NAME:
            raise SelectorError(f"{where}.key", f"only {_FIELD_NODE_NAME} is supported")
        if len(values) != 1:
            raise SelectorError(f"{where}.values", "must hold exactly one value")
    elif operator in ("In", "NotIn") and not values:
        raise SelectorError(f"{where}.values", f"must be non-empty for {operator}")
    elif operator in ("Exists", "DoesNotExist") and values:
        raise SelectorError(f"{where}.values", f"must be empty for {operator}")
    elif operator in ("Gt", "Lt") and (len(values) != 1 or _parse_int(values[0]) is None):
        raise SelectorError(f"{where}.values", f"must be a single integer for {operator}")
    return Requirement(key=key, operator=str(operator), values=values)


def compile_node_selector(raw: Any, where: str = "nodeSelector") -> tuple[Term, ...]:
    """Compiles a core/v1 NodeSelector (`nodeSelectorTerms`)."""
    if not isinstance(raw, Mapping):
        raise SelectorError(where, "must be an object")
    raw_terms = raw.get("nodeSelectorTerms")
    if not isinstance(raw_terms, list):
        raise SelectorError(f"{where}.nodeSelectorTerms", "must be a list")
    terms: list[Term] = []
    for i, raw_term in enumerate(raw_terms):
        at = f"{where}.nodeSelectorTerms[{i}]"
        if raw_term is None:
            raw_term = {}
        if not isinstance(raw_term, Mapping):
            raise SelectorError(at, "must be an object")
        exprs, fields = raw_term.get("matchExpressions") or [], raw_term.get("matchFields") or []
        if not isinstance(exprs, list) or not isinstance(fields, list):
            raise SelectorError(at, "matchExpressions and matchFields must be lists")
        terms.append(
            Term(
                expressions=tuple(
                    _requirement(e, f"{at}.matchExpressions[{j}]", field=False)
                    for j, e in enumerate(exprs)
                ),
                fields=tuple(
                    _requirement(f, f"{at}.matchFields[{j}]", field=True)
                    for j, f in enumerate(fields)
                ),
            )
        )
    return tuple(terms)


def _expression_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    present = req.key in labels
    value = labels.get(req.key, "")
    if req.operator == "In":
        return present and value in req.values
    if req.operator == "NotIn":
        return not present or value not in req.values
    if req.operator == "Exists":
        return present
    if req.operator == "DoesNotExist":
        return not present
    # Gt / Lt: a label that is absent or not an integer never matches.
    mine, bound = _parse_int(value) if present else None, _parse_int(req.values[0])
    if mine is None or bound is None:
        return False
    return mine > bound if req.operator == "Gt" else mine < bound


def _field_matches(req: Requirement, node_name: str) -> bool:
    inside = node_name in req.values
    return inside if req.operator == "In" else not inside


def node_selector_terms_match(
    terms: Sequence[Term], node_name: str, labels: Mapping[str, str]
) -> bool:
    """Terms are OR'ed, requirements inside a term AND'ed; an empty term
    matches nothing and so does an empty list, as in kube-scheduler."""
    for term in terms:
        if not term.expressions and not term.fields:
            continue
        if all(_expression_matches(r, labels) for r in term.expressions) and all(
            _field_matches(r, node_name) for r in term.fields
        ):
            return True
    return False


def node_selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """`spec.nodeSelector`: every pair must be present with an equal value."""
    return all(labels.get(k) == v for k, v in selector.items())


# --------------------------------------------------------------------------
# Taints and tolerations


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str


def _opt_str(raw: Mapping[str, Any], name: str, where: str) -> str:
    value = raw.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SelectorError(f"{where}.{name}", "must be a string")
    return value


def compile_taints(raw: Any, where: str = "taints") -> tuple[Taint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SelectorError(where, "must be a list")
    out: list[Taint] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise SelectorError(at, "must be an object")
        key, effect = _opt_str(item, "key", at), _opt_str(item, "effect", at)
        if not key:
            raise SelectorError(f"{at}.key", "must be non-empty")
        if effect not in TAINT_EFFECTS:
            raise SelectorError(
                f"{at}.effect", f"must be one of {', '.join(sorted(TAINT_EFFECTS))}"
            )
        out.append(Taint(key=key, value=_opt_str(item, "value", at), effect=effect))
    return tuple(out)


def compile_tolerations(raw: Any, where: str = "tolerations") -> tuple[Toleration, ...]:
    """Validates as the API server does: Exists takes no value, an empty key
    needs Exists (it then tolerates every taint)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SelectorError(where, "must be a list")
    out: list[Toleration] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise SelectorError(at, "must be an object")
        key, value = _opt_str(item, "key", at), _opt_str(item, "value", at)
        operator = _opt_str(item, "operator", at) or "Equal"
        effect = _opt_str(item, "effect", at)
        if operator not in ("Equal", "Exists"):
            raise SelectorError(f"{at}.operator", "must be Equal or Exists")
        if operator == "Exists" and value:
            raise SelectorError(f"{at}.value", "must be empty when operator is Exists")
        if not key and operator != "Exists":
            raise SelectorError(f"{at}.operator", "must be Exists when key is empty")
        if effect and effect not in TAINT_EFFECTS:
            raise SelectorError(
                f"{at}.effect", f"must be one of {', '.join(sorted(TAINT_EFFECTS))}"
            )
        out.append(Toleration(key=key, operator=operator, value=value, effect=effect))
    return tuple(out)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.value == taint.value


def untolerated_taints(
    taints: Sequence[Taint], tolerations: Sequence[Toleration]
) -> tuple[Taint, ...]:
    """Taints that keep the pod off the node (NoSchedule/NoExecute only)."""
    return tuple(
        t
        for t in taints
        if t.effect in _BLOCKING_EFFECTS and not any(tolerates(tol, t) for tol in tolerations)
    )
