"""Ways Kubernetes offers to ask for a vNPU by DRA that the ledger cannot serve, refused at
admission (issue 54, items 7 and 8): the chart's dra-admission policies
(templates/dra-admission.yaml), tried on the plane's API server by a tenant with `edit`
rights and by the admin.

- Admin access: a ResourceClaim or ResourceClaimTemplate request of DeviceClass vnpu.io
  with `adminAccess: true` (in a namespace the admin opened to admin access, where the API
  server itself lets it through), through every API version the server serves; a
  firstAvailable subrequest cannot carry the field at all. A claim without it, and admin
  access to another driver's class, are admitted.
- The implicit extended resource (KEP-5004): a pod asking for
  deviceclass.resource.kubernetes.io/vnpu.io in a container's limits, its requests, an init
  container, pod-level resources, a Deployment's pods, an in-place resize. An ordinary pod,
  and a pod asking for another class, are admitted.
- The operator may delete only ResourceSlices of driver vnpu.io.

No operator or agent runs: the API server alone refuses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import render
from dra_harness import claim_template, device_class, resource_claim
from tenant_harness import User, make_tenant

from localplane import LocalPlane, policies
from localplane.waiting import wait_for
from vnpu_common.wire import names

# Not yet on the 1.34 lane (k8s134): not run there so far.
pytestmark = pytest.mark.plane

RELEASE = "vnpu-dra-admission"
TEMPLATE = "templates/dra-admission.yaml"
RESOURCE = f"deviceclass.resource.kubernetes.io/{names.DRA_DEVICE_CLASS}"
# What the policies answer.
ADMIN_ACCESS = "adminAccess to vNPUs (DeviceClass vnpu.io) is not supported"
EXTENDED = f"resources {RESOURCE} (a DeviceClass as an extended resource) are not supported"
# The namespace label without which the API server refuses admin access itself.
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
OTHER_CLASS = "gpu.example.com"


def _manifests(plane: LocalPlane) -> str:
    docs = render(
        plane, "--show-only", TEMPLATE, "--set", f"fullnameOverride={RELEASE}",
        "--set", f"protection.operatorUsername={policies.OPERATOR_USER}",
    )  # fmt: skip
    return yaml.safe_dump_all(docs)


def _pod(name: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", **container}]},
    }


def _asking(where: str) -> dict[str, Any]:
    return {"resources": {where: {RESOURCE: "1"}}}


@pytest.fixture(scope="module")
def installed(plane: LocalPlane) -> Iterator[None]:
    """The policies as the chart renders them, and the DeviceClass vnpu.io (and another
    driver's) for the claims to name; removed after the module."""
    manifests = _manifests(plane)
    other = device_class()
    other["metadata"]["name"] = OTHER_CLASS
    other["spec"]["selectors"] = [{"cel": {"expression": f'device.driver == "{OTHER_CLASS}"'}}]
    had_class = plane.get_json("deviceclass", names.DRA_DEVICE_CLASS) is not None
    plane.apply(device_class())
    plane.apply(other)
    plane.kubectl("apply", "-f", "-", input=manifests)
    probe = yaml.safe_dump(_pod("probe", **_asking("limits")))

    def enforced() -> bool:
        out = plane.kubectl(
            "create", "--dry-run=server", "-n", "default", "-f", "-", input=probe, check=False
        )
        return out.returncode != 0 and EXTENDED in out.stderr

    wait_for("dra-admission policies enforced", enforced, 30)
    yield
    plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=manifests)
    plane.kubectl("delete", "deviceclass", OTHER_CLASS, "--ignore-not-found")
    if not had_class:
        plane.kubectl("delete", "deviceclass", names.DRA_DEVICE_CLASS, "--ignore-not-found")


@pytest.fixture
def tenant(plane: LocalPlane, namespace: str, tmp_path: Path, installed: None) -> User:
    """`edit` in its namespace, plus claims and claim templates (whatever `edit` grants of
    them in this Kubernetes version)."""
    rights = [
        (
            ["resource.k8s.io"],
            ["resourceclaims", "resourceclaimtemplates"],
            ["get", "list", "create", "delete"],
        ),
        # In-place resize, which `edit` may not grant.
        ([""], ["pods/resize"], ["get", "patch", "update"]),
    ]
    return make_tenant(plane, namespace, tmp_path / "tenant.kubeconfig", rights)


@pytest.fixture
def admin(plane: LocalPlane, namespace: str, installed: None) -> User:
    return User(plane, plane.kubeconfig, namespace)


def _admin_access(obj: dict[str, Any], *, template: bool = False) -> dict[str, Any]:
    spec = obj["spec"]["spec"] if template else obj["spec"]
    spec["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    return obj


def _create(user: User, obj: dict[str, Any], *extra: str) -> tuple[int, str]:
    return user.kubectl("create", *extra, "-f", "-", input=json.dumps(obj))


def _refused(user: User, why: str, obj: dict[str, Any], *extra: str) -> str:
    rc, out = _create(user, obj, *extra)
    assert rc != 0, f"{obj['kind']} {obj['metadata']['name']} was admitted"
    assert why in out, out
    assert "ValidatingAdmissionPolicy" in out, out
    return out


def test_admin_access_to_vnpus_is_refused_with_how_to_inspect_them(
    plane: LocalPlane, namespace: str, tenant: User, admin: User
) -> None:
    claim = _admin_access(resource_claim(namespace, "peek"))
    # Without the namespace label the API server refuses it itself (DRAAdminAccess).
    rc, out = _create(tenant, claim)
    assert rc != 0
    assert ADMIN_LABEL in out, out
    plane.kubectl("label", "namespace", namespace, f"{ADMIN_LABEL}=true")

    out = _refused(tenant, ADMIN_ACCESS, claim)
    assert "spec.devices.requests[npu]" in out, out
    assert "kubectl get vnpuallocations" in out, out
    assert "vnpu-agent check" in out, out
    # Through a template: refused when the template is written, not when a pod uses it.
    template = _admin_access(claim_template(namespace, "peek", "vir05_1c_16g"), template=True)
    out = _refused(tenant, ADMIN_ACCESS, template)
    assert "spec.spec.devices.requests[npu]" in out, out
    # Nobody is exempt: there is nothing to give an admin either.
    _refused(admin, ADMIN_ACCESS, claim)
    _refused(admin, ADMIN_ACCESS, template)
    # Among other requests, named.
    two = resource_claim(namespace, "two")
    two["spec"]["devices"]["requests"].append(
        {
            "name": "look",
            "exactly": {"deviceClassName": names.DRA_DEVICE_CLASS, "adminAccess": True},
        }
    )
    assert "spec.devices.requests[look]" in _refused(tenant, ADMIN_ACCESS, two)

    # Older API versions the server serves are converted to v1 for the policy.
    served = plane.kubectl("api-versions").stdout.split()
    older = [v for v in ("resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1") if v in served]
    for version in older:
        old = {**claim, "apiVersion": version, "metadata": {"name": "old"}}
        if version.endswith("v1beta1"):
            # v1beta1 has no `exactly`: the request's fields are its own.
            old["spec"] = {
                "devices": {
                    "requests": [
                        {"name": "npu", "deviceClassName": names.DRA_DEVICE_CLASS,
                         "adminAccess": True}
                    ]
                }
            }  # fmt: skip
        _refused(tenant, ADMIN_ACCESS, old)
    print(f"older resource.k8s.io versions tried: {older or 'none served'}")

    # A firstAvailable subrequest has no adminAccess field: refused by field validation,
    # dropped when validation is off, and the claim then asks for no admin access.
    first = resource_claim(namespace, "first")
    first["spec"]["devices"]["requests"] = [
        {
            "name": "npu",
            "firstAvailable": [
                {"name": "a", "deviceClassName": names.DRA_DEVICE_CLASS, "adminAccess": True}
            ],
        }
    ]
    rc, out = _create(tenant, first)
    assert rc != 0
    assert "adminAccess" in out, out
    tenant.ok("create", "--validate=false", "-f", "-", input=json.dumps(first))
    stored = plane.get_json("resourceclaim", "-n", namespace, "first")
    (sub,) = stored["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert "adminAccess" not in sub, sub

    # What stays admitted: claims without admin access, admin access to another class.
    for name in ("plain", "plain-by-admin"):
        user = admin if name.endswith("admin") else tenant
        rc, out = _create(user, resource_claim(namespace, name))
        assert rc == 0, out
    rc, out = _create(tenant, claim_template(namespace, "plain", "vir05_1c_16g"))
    assert rc == 0, out
    gpu = _admin_access(resource_claim(namespace, "gpu"))
    gpu["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = OTHER_CLASS
    rc, out = _create(tenant, gpu)
    assert rc == 0, out


def test_the_device_class_as_an_extended_resource_is_refused(
    plane: LocalPlane, namespace: str, tenant: User, admin: User
) -> None:
    # In limits (requests default to them), for a tenant and for the admin alike.
    out = _refused(tenant, EXTENDED, _pod("limits", **_asking("limits")))
    assert out.count("container main") == 1, out
    assert names.ANN_TEMPLATE in out, out
    assert "ResourceClaim" in out, out
    assert "requests.vnpu.io/vnpus" in out, out
    _refused(admin, EXTENDED, _pod("limits", **_asking("limits")))
    # In requests only (an extended resource needs its limit too; the policy says why
    # first), and in both.
    _refused(tenant, EXTENDED, _pod("requests", **_asking("requests")))
    both = {"resources": {"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}}}
    _refused(tenant, EXTENDED, _pod("both", **both))
    # In an init container, with a plain main container.
    init = _pod("init")
    init["spec"]["initContainers"] = [{"name": "setup", "image": "busybox", **_asking("limits")}]
    assert "init container setup" in _refused(tenant, EXTENDED, init)
    # A sidecar (restartable init container).
    sidecar = _pod("sidecar")
    sidecar["spec"]["initContainers"] = [
        {"name": "side", "image": "busybox", "restartPolicy": "Always", **_asking("limits")}
    ]
    assert "init container side" in _refused(tenant, EXTENDED, sidecar)
    # Pod-level resources: the API server allows only cpu, memory and hugepages there;
    # either it or the policy refuses.
    pod_level = _pod("pod-level")
    pod_level["spec"]["resources"] = {"limits": {RESOURCE: "1", "cpu": "1"}}
    rc, out = _create(tenant, pod_level)
    assert rc != 0
    assert EXTENDED in out or f'Unsupported value: "{RESOURCE}"' in out, out
    # A server-side dry run is refused alike.
    _refused(tenant, EXTENDED, _pod("dry", **_asking("limits")), "--dry-run=server")

    # What stays admitted: an ordinary pod, another class's extended resource.
    tenant.ok("create", "-f", "-", input=json.dumps(_pod("plain")))
    other = {"resources": {"limits": {f"deviceclass.resource.kubernetes.io/{OTHER_CLASS}": "1"}}}
    tenant.ok("create", "-f", "-", input=json.dumps(_pod("other", **other)))

    # In-place resize may not add it (only cpu and memory are resizable).
    resize = {"spec": {"containers": [{"name": "main", **_asking("limits")}]}}
    rc, out = tenant.kubectl(
        "patch", "pod", "plain", "--subresource=resize", "--type=strategic",
        "-p", json.dumps(resize),
    )  # fmt: skip
    assert rc != 0, "a resize added the extended resource"
    assert "only cpu and memory resources are mutable" in out or EXTENDED in out, out
    stored = plane.get_json("pod", "-n", namespace, "plain")
    assert RESOURCE not in json.dumps(stored["spec"])


def test_a_deployments_pods_are_refused_with_the_message_in_its_events(
    plane: LocalPlane, namespace: str, tenant: User
) -> None:
    """A controller's pods meet the policy too: the Deployment is admitted, its
    ReplicaSet's pod creates are refused, and the ReplicaSet's Events say why."""
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "by-class"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "by-class"}},
            "template": {
                "metadata": {"labels": {"app": "by-class"}},
                "spec": _pod("x", **_asking("limits"))["spec"],
            },
        },
    }
    tenant.ok("create", "-f", "-", input=json.dumps(deploy))

    def refused_event() -> str | None:
        events = plane.get_json("events", "-n", namespace)["items"]
        for e in events:
            if e.get("reason") == "FailedCreate" and EXTENDED in e.get("message", ""):
                return str(e["message"])
        return None

    message = wait_for("the ReplicaSet's FailedCreate event", refused_event, 60)
    assert "ValidatingAdmissionPolicy" in message
    pods = plane.get_json("pods", "-n", namespace)["items"]
    assert pods == []


def test_the_operator_deletes_only_vnpu_slices(plane: LocalPlane, installed: None) -> None:
    def slice_of(driver: str) -> dict[str, Any]:
        name = f"dra-admission-{driver.replace('.', '-')}"
        return {
            "apiVersion": names.RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [{"name": "d0"}],
            },
        }

    operator = User(plane, plane.operator_kubeconfig, "default")
    ours, theirs = slice_of(names.DRA_DRIVER), slice_of(OTHER_CLASS)
    for s in (ours, theirs):
        plane.apply(s)
    try:
        out = operator.denied(
            "may delete only ResourceSlices of driver vnpu.io, not gpu.example.com",
            "delete", "resourceslice", theirs["metadata"]["name"],
        )  # fmt: skip
        assert "ValidatingAdmissionPolicy" in out
        operator.ok("delete", "resourceslice", ours["metadata"]["name"])
        # The admin is not the operator: not narrowed.
        plane.kubectl("delete", "resourceslice", theirs["metadata"]["name"])
    finally:
        for s in (ours, theirs):
            plane.kubectl(
                "delete", "resourceslice", s["metadata"]["name"], "--ignore-not-found"
            )  # fmt: skip


def test_the_policies_type_check_against_the_servers_schema(
    plane: LocalPlane, installed: None
) -> None:
    """Every field the CEL names exists in this API server's resource.k8s.io/v1 and core/v1
    (the API server type-checks each policy against the kinds it matches, and says what
    it cannot resolve as a warning, which would be a check that never fires)."""
    # The control: a field the v1 ResourceClaim lacks (firstAvailable subrequests have no
    # adminAccess) is warned about. Never bound, so it refuses nothing.
    control = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{RELEASE}-control"},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                     "operations": ["CREATE"], "resources": ["resourceclaims"]}
                ]
            },
            "validations": [
                {"expression": "object.spec.devices.requests.all(r, "
                 "r.firstAvailable.all(s, !s.adminAccess))"}
            ],
        },
    }  # fmt: skip
    plane.apply(control)
    every = ("control", "dra-admin-access", "dra-admin-access-templates",
              "dra-extended-resource", "dra-slice-deletes")  # fmt: skip
    for name in every:

        def checked(name: str = name) -> dict[str, Any] | None:
            policy = plane.get_json("validatingadmissionpolicy", f"{RELEASE}-{name}")
            status = (policy or {}).get("status") or {}
            if status.get("observedGeneration") != policy["metadata"]["generation"]:
                return None
            return dict(status.get("typeChecking") or {"checked": True})

        typing = wait_for(f"{name} type-checked", checked, 30)
        if name == "control":
            plane.kubectl("delete", "validatingadmissionpolicy", f"{RELEASE}-control")
            assert "adminAccess" in json.dumps(typing), typing
        else:
            assert not typing.get("expressionWarnings"), (name, typing)
