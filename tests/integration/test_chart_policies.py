"""The protection policies (ValidatingAdmissionPolicies) the Helm chart ships: they name the
release's operator and exempt groups, and the local plane runs the same ones."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chart_harness import NAMESPACE, OPERATOR_SA, RELEASE, get_json, render

from localplane import LocalPlane, policies
from vnpu_common.wire import names
from vnpu_operator.admission.mutation import VISIBLE_DEVICES_FIELD_PATH

pytestmark = pytest.mark.plane


PROTECTIONS = (
    "pod-protection", "device-protection", "binding-protection", "allocation-protection",
    "nomination-protection",
)  # fmt: skip


def _protection(plane: LocalPlane, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The rendered admission policies and bindings of templates/protection*.yaml."""
    show = [arg for t in policies.templates() for arg in ("--show-only", t)]
    docs = render(plane, *show, *values)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _operator_checks(docs: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The CEL expressions of the four policies that name the operator."""
    policy = "ValidatingAdmissionPolicy"
    pods = docs[(policy, f"{RELEASE}-pod-protection")]["spec"]
    devices = docs[(policy, f"{RELEASE}-device-protection")]["spec"]
    binding = docs[(policy, f"{RELEASE}-binding-protection")]["spec"]
    allocations = docs[(policy, f"{RELEASE}-allocation-protection")]["spec"]
    return [
        *(c["expression"] for c in pods["matchConditions"] if c["name"] == "not-the-operator"),
        *(c["expression"] for c in devices["matchConditions"] if c["name"] == "not-the-operator"),
        *(c["expression"] for c in binding["matchConditions"] if c["name"] == "not-the-operator"),
        allocations["validations"][0]["expression"],
    ]


def test_protection_policies_name_the_release_operator_and_exempt_groups(
    plane: LocalPlane,
) -> None:
    docs = _protection(plane)
    for what in PROTECTIONS:
        name = f"{RELEASE}-{what}"
        assert docs[("ValidatingAdmissionPolicy", name)]["spec"]["failurePolicy"] == "Fail"
        binding = docs[("ValidatingAdmissionPolicyBinding", name)]["spec"]
        assert binding == {"policyName": name, "validationActions": ["Deny"]}
    assert len(docs) == 2 * len(PROTECTIONS)

    def named(docs: dict[tuple[str, str], dict[str, Any]], username: str) -> None:
        checks = _operator_checks(docs)
        assert len(checks) == 4
        for expression in checks:
            assert f'"{username}"' in expression, expression

    named(docs, f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}")
    named(
        _protection(plane, "--set", "operator.serviceAccount.name=custom-op"),
        f"system:serviceaccount:{NAMESPACE}:custom-op",
    )
    named(_protection(plane, "--set", "protection.operatorUsername=someone"), "someone")

    def exempt(docs: dict[tuple[str, str], dict[str, Any]]) -> set[str]:
        expressions = {
            c["expression"]
            for d in docs.values()
            for c in d["spec"].get("matchConditions", [])
            if c["name"] == "not-exempt"
        }
        assert len(expressions) == 1, expressions  # the pod, device and binding policies alike
        return expressions

    assert exempt(docs) == {
        "!has(request.userInfo.groups) || !request.userInfo.groups.exists(g, g in "
        '["system:masters"])'
    }
    (custom,) = exempt(
        _protection(plane, "--set-json", 'protection.exemptGroups=["ops","cluster admins"]')
    )
    assert custom.endswith('g in ["ops","cluster admins"])'), custom
    (none,) = exempt(_protection(plane, "--set-json", "protection.exemptGroups=[]"))
    assert none.endswith("g in [])"), none
    rendered = render(plane, "--set", "protection.enabled=false")
    assert not [d for d in rendered if d["metadata"]["name"].endswith("-protection")]

    # Every name the policies protect is the one the components use.
    pods = json.dumps(docs[("ValidatingAdmissionPolicy", f"{RELEASE}-pod-protection")]["spec"])
    for key in (
        names.ANN_TEMPLATE, names.ANN_COUNT, names.ANN_CHIP_MODEL, names.ANN_CONTAINERS,
        names.SCHEDULING_GATE, names.POD_FINALIZER,
    ):  # fmt: skip
        assert f"'{key}'" in pods, key
    devices = json.dumps(
        docs[("ValidatingAdmissionPolicy", f"{RELEASE}-device-protection")]["spec"]
    )
    assert f"'{names.ANN_VISIBLE_DEVICES}'" in devices
    assert f"'{names.ENV_VISIBLE_DEVICES}'" in devices
    # The field path the webhook writes is the one the policy accepts.
    assert VISIBLE_DEVICES_FIELD_PATH in devices
    allocations = docs[("ValidatingAdmissionPolicy", f"{RELEASE}-allocation-protection")]
    assert f"'{names.LABEL_NODE}'" in json.dumps(allocations["spec"])
    rules = allocations["spec"]["matchConstraints"]["resourceRules"]
    # Status writes too: only the agents report a vNPU's state.
    assert [r["resources"] for r in rules] == [
        [names.ALLOCATION_PLURAL, f"{names.ALLOCATION_PLURAL}/status"]
    ]


def test_the_local_plane_runs_the_charts_protection_policies(plane: LocalPlane) -> None:
    """One source: what the local plane installs is the chart's template, rendered for the
    local operator's identity."""
    docs = _protection(plane, *policies.settings())
    for what in PROTECTIONS:
        shipped = docs[("ValidatingAdmissionPolicy", f"{RELEASE}-{what}")]["spec"]
        local = get_json(plane, "validatingadmissionpolicy", f"{policies.RELEASE}-{what}")["spec"]
        for key in ("matchConditions", "validations"):
            assert local.get(key) == shipped.get(key), (what, key)
        assert local["matchConstraints"]["resourceRules"] == [
            {**r, "scope": "*"} for r in shipped["matchConstraints"]["resourceRules"]
        ]
