"""Someone with a kubeconfig of their own, and tenants as clusters make them: a
ServiceAccount bound to the built-in `edit` ClusterRole in its namespace, plus
whatever rights a route needs on top."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localplane import LocalPlane

ONLY_OPERATOR = "only the vnpu-operator may"

# (apiGroups, resources, verbs) of a Role.
Rule = tuple[list[str], list[str], list[str]]


@dataclass
class User:
    """Someone with a kubeconfig of their own."""

    plane: LocalPlane
    kubeconfig: Path
    namespace: str

    def kubectl(self, *args: str, input: str | None = None) -> tuple[int, str]:
        # The namespace first: after a `--` it would be the command's argument.
        r = self.plane.kubectl(
            "-n", self.namespace, *args, check=False, input=input, kubeconfig=self.kubeconfig
        )
        return r.returncode, r.stdout + r.stderr

    def ok(self, *args: str, input: str | None = None) -> str:
        rc, out = self.kubectl(*args, input=input)
        assert rc == 0, f"kubectl {' '.join(args)}: {out}"
        return out

    def denied(self, why: str, *args: str, input: str | None = None) -> str:
        """The write is refused, saying `why`; returns what kubectl said."""
        rc, out = self.kubectl(*args, input=input)
        assert rc != 0, f"kubectl {' '.join(args)} was accepted"
        assert why in out, out
        return out

    def refused(self, field: str, *args: str, input: str | None = None) -> None:
        """The write is refused by a protection policy, naming `field`."""
        out = self.denied(field, *args, input=input)
        assert ONLY_OPERATOR in out, out
        assert "ValidatingAdmissionPolicy" in out, out

    def apply(self, obj: dict[str, Any]) -> str:
        return self.ok("apply", "-f", "-", input=json.dumps(obj))

    def patch(self, pod: str, kind: str, patch: Any, *extra: str) -> tuple[str, ...]:
        return ("patch", "pod", pod, f"--type={kind}", "-p", json.dumps(patch), *extra)


def make_tenant(
    plane: LocalPlane,
    namespace: str,
    kubeconfig: Path,
    extra: Sequence[Rule] = (),
    *,
    cluster_role: str | None = "edit",
) -> User:
    """ServiceAccount `tenant` of `namespace`, bound there to `cluster_role` (the
    usual namespace rights) and to a Role of `extra` rules, with a token kubeconfig
    written to `kubeconfig`."""
    plane.kubectl("create", "serviceaccount", "tenant", "-n", namespace)
    subject = f"--serviceaccount={namespace}:tenant"
    if cluster_role:
        plane.kubectl(
            "create", "rolebinding", "tenant-usual", "-n", namespace,
            f"--clusterrole={cluster_role}", subject,
        )  # fmt: skip
    if extra:
        plane.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "tenant", "namespace": namespace},
                "rules": [{"apiGroups": g, "resources": r, "verbs": v} for g, r, v in extra],
            }
        )
        plane.kubectl(
            "create", "rolebinding", "tenant", "-n", namespace, "--role=tenant", subject
        )  # fmt: skip
    user = User(plane, plane.token_kubeconfig(kubeconfig, "tenant", namespace), namespace)
    rc, out = user.kubectl("auth", "can-i", "create", "pods")
    assert (rc, out.strip()) == (0, "yes"), out
    return user
