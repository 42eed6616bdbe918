"""SECURITY.md's "What the components may do" against the rendered chart: every
rule any render grants is a row of its account's table, and every row is granted
by some render. Renders: the defaults; every feature that adds rights on (DRA,
preemption, authenticated metrics, the Pod Security hook, tenant read); and that
again with webhook.certSource=cert-manager, which takes rights away."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_harness import NAMESPACE, RELEASE, SIM_VALUES, render

from localplane import LocalPlane

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
SECURITY = ROOT / "SECURITY.md"

EVERYTHING = (
    *SIM_VALUES,
    "--kube-version", "1.37.0",
    "--set", "agent.dra=true",
    "--set", "operator.preemption.enabled=true",
    "--set", "metrics.auth=kubernetes",
    "--set", "metrics.scrapers[0].kind=ServiceAccount",
    "--set", "metrics.scrapers[0].name=prometheus",
    "--set", "metrics.scrapers[0].namespace=monitoring",
    "--set", "podSecurity.manageNamespace=true",
    "--set", "tenantRead.enabled=true",
)  # fmt: skip
CERT_MANAGER = ("--set", "webhook.certSource=cert-manager", "--api-versions", "cert-manager.io/v1")

# Rendered ServiceAccount (or role, for unbound aggregated roles) -> the account's marker.
ACCOUNTS = {
    f"{RELEASE}-operator": "operator",
    f"{RELEASE}-agent": "agent",
    f"{RELEASE}-pre-delete": "pre-delete",
    f"{RELEASE}-pod-security": "pod-security",
    f"{RELEASE}-test": "test",
    f"{RELEASE}-tenant-read": "tenant-read",
    f"{RELEASE}-metrics-reader": "metrics-reader",
}
VERBS = {
    "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection",
    "arbitrary-node:patch", "arbitrary-node:update", "use", "bind", "escalate", "impersonate",
}  # fmt: skip

# (account, resource, verb, namespaced, resourceNames)
Grant = tuple[str, str, str, bool, frozenset[str]]


def granted(docs: list[dict[str, Any]]) -> set[Grant]:
    roles = {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d.get("kind") in ("Role", "ClusterRole")
    }
    holders: dict[tuple[str, str], set[str]] = {}
    for d in docs:
        if d.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
            ref = (d["roleRef"]["kind"], d["roleRef"]["name"])
            for subject in d.get("subjects") or []:
                # The chart's own accounts by name; anyone else's (metrics.scrapers) by
                # the role they are given.
                ours = subject["kind"] == "ServiceAccount" and subject.get("namespace") in (
                    None,
                    NAMESPACE,
                )
                holders.setdefault(ref, set()).add(subject["name"] if ours else ref[1])
    out: set[Grant] = set()
    for key, role in roles.items():
        # An aggregated or unbound role is documented by its own name.
        for holder in holders.get(key) or {key[1]}:
            account = ACCOUNTS.get(holder)
            assert account, f"{key} is held by {holder}, which SECURITY.md has no table for"
            for rule in role.get("rules") or []:
                names = frozenset(rule.get("resourceNames") or ())
                things = [*(rule.get("resources") or ()), *(rule.get("nonResourceURLs") or ())]
                for thing in things:
                    for verb in rule["verbs"]:
                        out.add((account, thing, verb, key[0] == "Role", names))
    return out


def documented() -> set[Grant]:
    """The rows of each `<!-- rbac: account -->` table, with `<release>` and
    `<namespace>` as the renders name them."""
    text = SECURITY.read_text()
    out: set[Grant] = set()
    for match in re.finditer(r"<!-- rbac: ([a-z-]+) -->\n((?:\|.*\n)+)", text):
        account, table = match.group(1), match.group(2).splitlines()[2:]
        for row in table:
            cells = [c.strip() for c in row.strip("|").split("|")]
            what, verbs = cells[0], cells[1]
            namespaced = "(namespaced)" in what
            things = [t.strip() for t in what.replace("(namespaced)", "").split(",")]
            only = verbs.split("only", 1)
            names = frozenset(
                n.replace("<release>", RELEASE).replace("<namespace>", NAMESPACE)
                for n in re.findall(r"`([^`]+)`", only[1] if len(only) > 1 else "")
            )
            # "create; get, patch, only `x`": the names bind the verbs after the last ";".
            groups = only[0].split(";")
            for i, group in enumerate(groups):
                group_names = names if i == len(groups) - 1 else frozenset()
                for verb in re.findall(r"[a-z][a-z-]*(?::[a-z]+)?", group):
                    assert verb in VERBS, f"SECURITY.md ({account}): {verb!r} in {row!r}"
                    for thing in things:
                        out.add((account, thing, verb, namespaced, group_names))
    assert out, "SECURITY.md has no rbac tables"
    return out


@pytest.fixture(scope="module")
def renders(plane: LocalPlane) -> list[set[Grant]]:
    return [
        granted(render(plane, *SIM_VALUES)),
        granted(render(plane, *EVERYTHING)),
        granted(render(plane, *EVERYTHING, *CERT_MANAGER)),
    ]


def _show(grants: Iterator[Grant] | set[Grant]) -> str:
    lines = []
    for a, t, v, ns, n in sorted(grants, key=str):
        where = " (namespaced)" if ns else ""
        only = f" only {','.join(sorted(n))}" if n else ""
        lines.append(f"  {a}: {t} {v}{where}{only}")
    return "\n".join(lines)


def test_every_rule_the_chart_grants_is_in_security_md(renders: list[set[Grant]]) -> None:
    docs = documented()
    missing = set().union(*renders) - docs
    assert not missing, f"granted by the chart, not in SECURITY.md:\n{_show(missing)}"


def test_every_rule_in_security_md_is_granted_by_some_render(renders: list[set[Grant]]) -> None:
    stale = documented() - set().union(*renders)
    assert not stale, f"in SECURITY.md, granted by no render:\n{_show(stale)}"


def test_the_defaults_grant_no_optional_rights(renders: list[set[Grant]]) -> None:
    defaults = renders[0]
    accounts = {a for a, *_ in defaults}
    # No DRA, no preemption, no token reviews, no hooks but the uninstall's, no scrapers.
    assert accounts == {"operator", "agent", "pre-delete", "tenant-read", "test"}, accounts
    things = {t for _, t, *_ in defaults}
    for optional in ("resourceclaims", "resourceslices", "pods/eviction", "tokenreviews"):
        assert optional not in things, optional
    # Webhook configurations: get and patch by name, never create.
    webhook = {(v, n) for a, t, v, _, n in defaults if t == "mutatingwebhookconfigurations"}
    assert webhook == {
        ("get", frozenset({"vnpu-operator"})),
        ("patch", frozenset({"vnpu-operator"})),
    }


def test_cert_manager_takes_the_webhook_rights_away(renders: list[set[Grant]]) -> None:
    with_cm = {t for _, t, *_ in renders[2]}
    assert "mutatingwebhookconfigurations" not in with_cm
    assert "validatingwebhookconfigurations" not in with_cm
