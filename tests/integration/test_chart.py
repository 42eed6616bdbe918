"""The Helm chart against a real kube-apiserver: lint, schema, server-side validation,
install, RBAC of each component, the agents' node scoping (ValidatingAdmissionPolicy),
upgrade and uninstall.

The tests of this module share one release and run in file order: install first,
uninstall last.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, RELEASE, adopt_crds, helm, template
from operator_harness import Stack

from localplane import LocalPlane, NodeSpec, policies
from localplane.waiting import wait_for as shared_wait_for
from vnpu_common import names
from vnpu_common.patches import JSON_PATCH, MERGE
from vnpu_operator.admission import (
    ServiceRef,
    mutating_webhook_configuration,
    validating_webhook_configuration,
)
from vnpu_operator.admission.mutation import VISIBLE_DEVICES_FIELD_PATH

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "vnpu-system-chart"
OPERATOR_SA = "vnpu-operator-operator"
AGENT_SA = "vnpu-operator-agent"
NODE_A, NODE_B = "chart-npu-a", "chart-npu-b"
SIM_VALUES = ("--set", "agent.driver=sim", "--set", "agent.simChips=910B3=2")


def render(plane: LocalPlane, *args: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    out = template(plane, *args, namespace=namespace).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def get_json(plane: LocalPlane, *args: str) -> Any:
    return json.loads(plane.kubectl("get", *args, "-o", "json").stdout)


@dataclass
class Credential:
    """A bearer token and the API server it is good for; no client certificate."""

    plane: LocalPlane
    token: str

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        ctx = ssl.create_default_context(cafile=str(self.plane.ca_file))
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.plane.server + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def can_i(self, verb: str, resource: str, namespace: str | None = None) -> bool:
        kubeconfig = self.plane.workdir / "empty-kubeconfig"
        kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
        args = [
            self.plane.binary("kubectl"),
            f"--kubeconfig={kubeconfig}",
            f"--server={self.plane.server}",
            f"--certificate-authority={self.plane.ca_file}",
            f"--token={self.token}",
            "auth",
            "can-i",
            verb,
        ]
        # "pods/status" is a subresource here, "kind/name" a resource name.
        if resource.endswith("/status"):
            args += [resource.removesuffix("/status"), "--subresource=status"]
        else:
            args.append(resource)
        args += ["-n", namespace] if namespace else ["--all-namespaces"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
        answer = proc.stdout.strip()
        assert answer in ("yes", "no"), f"can-i {verb} {resource}: {proc.stdout} {proc.stderr}"
        return answer == "yes"

    def whoami(self) -> dict[str, Any]:
        status, body = self.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert status == 201, body
        return dict(body["status"]["userInfo"])


def token(plane: LocalPlane, sa: str, *bound: str) -> Credential:
    out = plane.kubectl("create", "token", sa, "-n", NAMESPACE, "--duration=1h", *bound)
    return Credential(plane, out.stdout.strip())


# Helm installs and DaemonSet rollouts take their time on a busy machine.
wait_for = functools.partial(shared_wait_for, timeout=90, interval=0.5)


def agent_pod(plane: LocalPlane, node: str) -> str:
    def find() -> str | None:
        pods = get_json(
            plane,
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/component=agent",
            "--field-selector",
            f"spec.nodeName={node}",
        )["items"]
        return pods[0]["metadata"]["name"] if pods else None

    return str(wait_for(f"agent pod on {node}", find))


# ---------------------------------------------------------------- static checks


def test_helm_lint_strict(plane: LocalPlane) -> None:
    helm(plane, "lint", "--strict", str(CHART))
    helm(
        plane,
        "lint",
        "--strict",
        str(CHART),
        *SIM_VALUES,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "operator.podDisruptionBudget.enabled=true",
    )


def test_chart_crds_are_the_generated_ones() -> None:
    generated = {p.name: p.read_text() for p in sorted((ROOT / "crds").glob("*.yaml"))}
    shipped = {p.name: p.read_text() for p in sorted((CHART / "files" / "crds").glob("*.yaml"))}
    assert shipped == generated, "charts/vnpu-operator/files/crds drifted: cp crds/*.yaml there"


def test_rendered_crds_are_kept_on_uninstall(plane: LocalPlane) -> None:
    crds = [d for d in render(plane) if d["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == [
        f"{names.ALLOCATION_PLURAL}.{names.GROUP}",
        f"{names.NODE_PLURAL}.{names.GROUP}",
    ]
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [
        d
        for d in render(plane, "--set", "crds.install=false")
        if d["kind"] == "CustomResourceDefinition"
    ]


def test_webhook_configurations_match_what_the_operator_registers(plane: LocalPlane) -> None:
    docs = render(plane)
    service = ServiceRef(namespace=NAMESPACE, name=f"{RELEASE}-webhook", port=443)
    expected = {
        "MutatingWebhookConfiguration": mutating_webhook_configuration(service, None),
        "ValidatingWebhookConfiguration": validating_webhook_configuration(service, None),
    }
    for kind, body in expected.items():
        (shipped,) = [d for d in docs if d["kind"] == kind]
        assert shipped["metadata"]["name"] == body["metadata"]["name"]
        assert shipped["webhooks"] == body["webhooks"], kind
    # The operator registers the Service the chart creates, on the same port.
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["VNPU_WEBHOOK_SERVICE"] == f"{NAMESPACE}/{RELEASE}-webhook:443"
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == service.name]
    assert svc["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    ports = deploy["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in ports


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


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("agent.driver=cuda", "at '/agent/driver': value must be one of 'dcmi', 'npu-smi', 'sim'"),
        (
            "operator.metricsPort=70000",
            "at '/operator/metricsPort': maximum: got 70,000, want 65,535",
        ),
        (
            "operator.policy=random",
            "at '/operator/policy': value must be one of 'binpack', 'spread'",
        ),
        ("agent.hostPaths.driver=relative/dir", "at '/agent/hostPaths/driver'"),
        ("operator.replicas=2", "additional properties 'replicas' not allowed"),
    ],
)
def test_values_schema_rejects_bad_values(plane: LocalPlane, setting: str, message: str) -> None:
    proc = template(plane, "--set", setting, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_runtime_class_reaches_the_operator_and_is_created_on_request(
    plane: LocalPlane,
) -> None:
    def operator_env(docs: list[dict[str, Any]]) -> str | None:
        (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        value: str | None = env.get("VNPU_RUNTIME_CLASS_NAME")
        return value

    plain = render(plane)
    assert operator_env(plain) == ""
    assert not [d for d in plain if d["kind"] == "RuntimeClass"]

    named = render(plane, "--set", "runtimeClassName=ascend-vnpu")
    assert operator_env(named) == "ascend-vnpu"
    assert not [d for d in named if d["kind"] == "RuntimeClass"]

    created = render(
        plane, "--set", "runtimeClassName=ascend-vnpu", "--set", "runtimeClass.create=true",
        "--set", "runtimeClass.handler=ascend",
    )  # fmt: skip
    (rc,) = [d for d in created if d["kind"] == "RuntimeClass"]
    assert (rc["metadata"]["name"], rc["handler"]) == ("ascend-vnpu", "ascend")

    refused = template(plane, "--set", "runtimeClass.create=true", check=False)
    assert refused.returncode != 0
    assert "runtimeClass.create needs runtimeClassName" in refused.stderr


def test_rendered_manifests_pass_server_side_validation(plane: LocalPlane, namespace: str) -> None:
    for values in (
        (*SIM_VALUES, "--set", "operator.podDisruptionBudget.enabled=true"),
        ("--set", "agent.driver=npu-smi"),
        ("--set", "agent.driver=dcmi", "--set", "nodeScoping.enabled=false"),
        (
            "--set-json",
            'agent.npuNodeLabels=["vnpu","ascend","nfd"]',
            "--set",
            "agent.updateStrategy.type=OnDelete",
            "--set",
            "image.digest=sha256:" + "0" * 64,
            "--set",
            "operator.priorityClassName=system-cluster-critical",
        ),
    ):
        # The test hook's pod needs its ServiceAccount to exist, which a dry run does not
        # make: test_the_test_hook_passes_... validates it once the account exists.
        out = template(plane, *values, "--skip-tests", namespace=namespace).stdout
        proc = plane.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=out, check=False, timeout=120
        )
        assert proc.returncode == 0, f"{values}: {proc.stderr}"
        assert "(server dry run)" in proc.stdout


def test_driver_host_mounts(plane: LocalPlane) -> None:
    def daemonset(*values: str) -> dict[str, Any]:
        (ds,) = [d for d in render(plane, *values) if d["kind"] == "DaemonSet"]
        return ds

    spec = daemonset("--set", "agent.driver=dcmi")["spec"]["template"]["spec"]
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths == {
        "/dev",
        "/usr/local/Ascend/driver",
        "/usr/local/sbin/npu-smi",
        "/etc/vnpu.cfg",
        "/var/run/cdi",
        "/var/lib/vnpu-agent",
    }
    container = spec["containers"][0]
    assert container["securityContext"]["privileged"] is True
    # Which nodes: agent.npuNodeLabels (test_agent_tolerates_ascend_taints_...).
    assert "nodeSelector" not in spec
    env = {e["name"]: e for e in container["env"]}
    assert env["VNPU_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["VNPU_DRIVER"]["value"] == "dcmi"

    sim = daemonset(*SIM_VALUES)["spec"]["template"]["spec"]
    assert {v["hostPath"]["path"] for v in sim["volumes"] if "hostPath" in v} == {
        "/var/run/cdi",
        "/var/lib/vnpu-agent",
    }
    assert "privileged" not in sim["containers"][0]["securityContext"]
    assert sim["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def _agent(plane: LocalPlane, *values: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The agent DaemonSet's pod spec and its container."""
    (ds,) = [d for d in render(plane, *values) if d["kind"] == "DaemonSet"]
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def test_real_drivers_run_the_agent_as_root_and_sim_without_capabilities(
    plane: LocalPlane,
) -> None:
    for driver in ("dcmi", "npu-smi"):
        spec, container = _agent(plane, "--set", f"agent.driver={driver}")
        ctx = container["securityContext"]
        # The image's USER is 10001: a privileged container running as that user loses
        # every capability at exec and cannot open the root-owned driver files.
        assert ctx["privileged"] is True, driver
        assert (ctx.get("runAsUser"), ctx.get("runAsGroup")) == (0, 0), driver
        assert ctx.get("runAsNonRoot") is False, driver
        assert spec["securityContext"].get("runAsNonRoot") is not True, driver
        refused = template(plane, "--set", f"agent.driver={driver}",
                           "--set", "agent.simDeviceDir=/run/vnpu-sim", check=False)  # fmt: skip
        assert refused.returncode != 0
        assert "agent.simDeviceDir is for agent.driver=sim only" in refused.stderr

    _, sim = _agent(plane, *SIM_VALUES)
    ctx = sim["securityContext"]
    assert "privileged" not in ctx
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert "VNPU_SIM_DEVICE_DIR" not in {e["name"] for e in sim["env"]}

    # Device nodes for a runtime on the host: the directory mounted at the same path, and
    # CAP_MKNOD, the one capability mknod needs, nothing else.
    spec, sim = _agent(plane, *SIM_VALUES, "--set", "agent.simDeviceDir=/run/vnpu-sim")
    ctx = sim["securityContext"]
    assert "privileged" not in ctx
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["MKNOD"]}
    env = {e["name"]: e.get("value") for e in sim["env"]}
    assert env["VNPU_SIM_DEVICE_DIR"] == "/run/vnpu-sim"
    (volume,) = [v for v in spec["volumes"] if v["name"] == "sim-devices"]
    assert volume["hostPath"] == {"path": "/run/vnpu-sim", "type": "DirectoryOrCreate"}
    assert {"name": "sim-devices", "mountPath": "/run/vnpu-sim"} in sim["volumeMounts"]


def test_cdi_host_device_dir_follows_the_driver_and_can_be_set(plane: LocalPlane) -> None:
    """The CDI specs' host paths: /dev for a real driver, the sim's device dir
    when it makes device nodes (so a runtime finds them), or what is set."""

    def host_device_dir(*values: str) -> str | None:
        _, container = _agent(plane, *values)
        env = {e["name"]: e.get("value") for e in container["env"]}
        return env.get("VNPU_CDI_HOST_DEVICE_DIR")

    assert host_device_dir() == "/dev"
    assert host_device_dir(*SIM_VALUES) == "/dev"
    assert host_device_dir(*SIM_VALUES, "--set", "agent.simDeviceDir=/run/vnpu-sim") == (
        "/run/vnpu-sim"
    )
    assert host_device_dir("--set", "agent.cdiHostDeviceDir=/host/dev") == "/host/dev"
    refused = template(plane, "--set", "agent.cdiHostDeviceDir=dev", check=False)
    assert refused.returncode != 0
    assert "at '/agent/cdiHostDeviceDir'" in refused.stderr


def test_api_server_address_reaches_both_components(plane: LocalPlane) -> None:
    def envs(*values: str) -> list[dict[str, str | None]]:
        docs = render(plane, *SIM_VALUES, *values)
        pods = [
            d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")
        ]
        assert len(pods) == 2
        return [{e["name"]: e.get("value") for e in p["containers"][0]["env"]} for p in pods]

    # Unset: the kubelet's own KUBERNETES_SERVICE_* (the kubernetes Service) stay.
    for env in envs():
        assert "KUBERNETES_SERVICE_HOST" not in env
        assert "KUBERNETES_SERVICE_PORT" not in env
    for env in envs("--set", "apiServer.host=10.88.0.1", "--set", "apiServer.port=6443"):
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
            "10.88.0.1", "6443",
        )  # fmt: skip
    refused = template(plane, "--set", "apiServer.host=https://10.88.0.1:6443", check=False)
    assert refused.returncode != 0
    assert "at '/apiServer/host'" in refused.stderr


# ---------------------------------------------------------------- issue 16: clusters people run


def test_agent_tolerates_ascend_taints_and_selects_npu_nodes_by_their_labels(
    plane: LocalPlane,
) -> None:
    spec, _ = _agent(plane)
    assert "nodeSelector" not in spec
    assert {(t["key"], t["operator"]) for t in spec["tolerations"]} == {
        ("huawei.com/Ascend910", "Exists"),
        ("huawei.com/Ascend310P", "Exists"),
        ("huawei.com/Ascend310", "Exists"),
    }
    assert all("effect" not in t for t in spec["tolerations"])  # every effect

    def terms(*values: str) -> list[dict[str, Any]] | None:
        spec, _ = _agent(plane, *values)
        affinity = spec.get("affinity", {}).get("nodeAffinity")
        if affinity is None:
            return None
        required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        return list(required["nodeSelectorTerms"])

    npu = {"key": names.LABEL_NPU_NODE, "operator": "In", "values": ["true"]}
    ascend = {
        "key": "accelerator",
        "operator": "In",
        "values": ["huawei-Ascend910", "huawei-Ascend310P", "huawei-Ascend310"],
    }
    nfd = {
        "key": "feature.node.kubernetes.io/pci-1200_19e5.present",
        "operator": "In",
        "values": ["true"],
    }
    assert terms() == [{"matchExpressions": [npu]}]
    assert terms("--set-json", 'agent.npuNodeLabels=["ascend","nfd"]') == [
        {"matchExpressions": [ascend]},
        {"matchExpressions": [nfd]},
    ]
    assert terms("--set-json", "agent.npuNodeLabels=[]") is None
    # A nodeAffinity of the admin's replaces ours; other affinity is kept beside ours.
    own = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["npu"]}]}
    ]}}  # fmt: skip
    spec, _ = _agent(plane, "--set-json", f"agent.affinity={json.dumps({'nodeAffinity': own})}")
    assert spec["affinity"] == {"nodeAffinity": own}
    anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    spec, _ = _agent(plane, "--set-json", f"agent.affinity={json.dumps(anti)}")
    assert spec["affinity"]["podAntiAffinity"] == anti["podAntiAffinity"]
    assert spec["affinity"]["nodeAffinity"]
    spec, _ = _agent(plane, "--set-json", "agent.tolerations=[]")
    assert "tolerations" not in spec

    refused = template(plane, "--set-json", 'agent.npuNodeLabels=["gpu"]', check=False)
    assert refused.returncode != 0
    assert "at '/agent/npuNodeLabels/0'" in refused.stderr


def test_image_digest_pins_the_image(plane: LocalPlane) -> None:
    digest = "sha256:" + "ab" * 32

    def images(*values: str) -> set[str]:
        docs = render(plane, *values)
        pods = [
            d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")
        ]
        pods += [d["spec"] for d in docs if d["kind"] == "Pod"]  # the helm test hook
        assert len(pods) == 3
        return {c["image"] for p in pods for c in p["containers"]}

    assert images() == {"vnpu-operator:0.1.0"}
    assert images("--set", f"image.digest={digest}") == {f"vnpu-operator@{digest}"}
    assert images("--set", f"image.digest={digest}", "--set", "image.tag=v1") == {
        f"vnpu-operator:v1@{digest}"
    }
    refused = template(plane, "--set", "image.digest=latest", check=False)
    assert refused.returncode != 0
    assert "at '/image/digest'" in refused.stderr


def test_agent_rollout_takes_a_tenth_at_a_time_and_never_surges(plane: LocalPlane) -> None:
    def strategy(*values: str) -> dict[str, Any]:
        (ds,) = [d for d in render(plane, *values) if d["kind"] == "DaemonSet"]
        return dict(ds["spec"]["updateStrategy"])

    assert strategy() == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%", "maxSurge": 0},
    }
    assert strategy("--set", "agent.updateStrategy.type=OnDelete") == {"type": "OnDelete"}
    refused = template(plane, "--set", "agent.updateStrategy.rollingUpdate.maxSurge=1", check=False)
    assert refused.returncode != 0
    assert "at '/agent/updateStrategy/rollingUpdate/maxSurge'" in refused.stderr


def test_critical_pod_quota_matches_the_critical_classes_the_release_uses(
    plane: LocalPlane,
) -> None:
    def quota(*values: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        found = [
            d for d in render(plane, *values, namespace=namespace) if d["kind"] == "ResourceQuota"
        ]
        return found[0] if found else None

    default = quota()
    assert default is not None
    (selector,) = default["spec"]["scopeSelector"]["matchExpressions"]
    assert selector == {
        "scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"],
    }  # fmt: skip
    both = quota("--set", "operator.priorityClassName=system-cluster-critical")
    assert both is not None
    (selector,) = both["spec"]["scopeSelector"]["matchExpressions"]
    assert selector["values"] == ["system-node-critical", "system-cluster-critical"]
    assert quota("--set", "criticalPodQuota.enabled=false") is None
    assert quota("--set", "agent.priorityClassName=high") is None
    # kube-system has its own (the API server makes it).
    assert quota(namespace="kube-system") is None


def test_helm_template_needs_no_cluster_only_the_kube_version(
    plane: LocalPlane, tmp_path: Path
) -> None:
    """What the chart README says: no API server is asked; Helm's default Kubernetes
    version (this helm's is v1.20.0) fails the chart's kubeVersion, naming it."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }

    def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [plane.binary("helm"), "template", RELEASE, str(CHART), "-n", "vnpu-system", *args],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip

    rendered = helm_template("--kube-version", "1.34")
    assert rendered.returncode == 0, rendered.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert {"Deployment", "DaemonSet", "CustomResourceDefinition", "Pod"} <= kinds
    # An option that needs an API of the cluster's says so, and renders once it is named.
    cert_manager = ("--kube-version", "1.34", "--set", "webhook.certSource=cert-manager")
    refused = helm_template(*cert_manager)
    assert refused.returncode != 0
    assert "--api-versions cert-manager.io/v1" in refused.stderr
    rendered = helm_template(*cert_manager, "--api-versions", "cert-manager.io/v1")
    assert rendered.returncode == 0, rendered.stderr
    assert "Certificate" in {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    old = helm_template("--kube-version", "1.29")
    assert old.returncode != 0
    assert "chart requires kubeVersion: >=1.30.0-0" in old.stderr
    readme = (CHART / "README.md").read_text()
    assert "--kube-version 1.34" in readme
    assert "--api-versions cert-manager.io/v1" in readme


def _hook(plane: LocalPlane, namespace: str, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    docs = render(
        plane, "--show-only", "templates/tests/webhook-test.yaml", *values, namespace=namespace
    )
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


TEST_SA = f"{RELEASE}-test"


def test_the_test_hook_runs_the_script_with_a_dry_run_only_account(plane: LocalPlane) -> None:
    docs = _hook(plane, NAMESPACE)
    pod = docs[("Pod", f"{TEST_SA}-webhook")]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = pod["spec"]["containers"][0]
    assert container["command"][:2] == ["python", "-c"]
    assert container["command"][2] == (CHART / "files" / "check_webhook.py").read_text()
    assert pod["spec"]["serviceAccountName"] == TEST_SA
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    role = docs[("Role", TEST_SA)]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    # Only the pod is a test hook: `helm test --logs` reads every test hook as a pod.
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        annotations = docs[(kind, TEST_SA)]["metadata"].get("annotations", {})
        assert "helm.sh/hook" not in annotations, kind
    policy = docs[("ValidatingAdmissionPolicy", f"{TEST_SA}-dry-run-only")]
    assert "helm.sh/hook" not in policy["metadata"].get("annotations", {})
    (condition,) = policy["spec"]["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:{TEST_SA}"' in condition["expression"]


def _run_hook_script(
    plane: LocalPlane,
    pod: dict[str, Any],
    namespace: str,
    token_text: str,
    workdir: Path,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """What the kubelet would run for the hook pod: its command, its env, the
    token of its ServiceAccount, against this plane's API server."""
    sa_dir = workdir / "serviceaccount"
    sa_dir.mkdir(exist_ok=True)
    (sa_dir / "token").write_text(token_text)
    (sa_dir / "ca.crt").write_bytes(plane.ca_file.read_bytes())
    container = pod["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    command = [sys.executable, *container["command"][1:]]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            "PATH": "/usr/bin:/bin",
            **pod_env,
            "VNPU_TEST_NAMESPACE": namespace,
            "VNPU_TEST_SA_DIR": str(sa_dir),
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(plane.ports.apiserver),
            **env,
        },
    )


def test_the_test_hook_passes_when_the_webhook_refuses_and_fails_when_it_is_gone(
    plane: LocalPlane, namespace: str, tmp_path: Path
) -> None:
    """The hook's own manifests and script, against a running operator's webhook."""
    docs = _hook(plane, namespace)
    for (kind, _), doc in docs.items():
        if kind != "Pod":
            plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    stack = Stack(plane, tmp_path / "stack", [NodeSpec(name="chart-hook-npu", chips={"910B3": 1})])
    stack.start()
    try:
        cred = plane.kubectl("create", "token", TEST_SA, "-n", namespace).stdout.strip()
        pod = docs[("Pod", f"{TEST_SA}-webhook")]
        valid = plane.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
        assert "(server dry run)" in valid.stdout
        ran = _run_hook_script(plane, pod, namespace, cred, tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert (
            ran.stdout.strip()
            .splitlines()[-1]
            .startswith(
                f"PASS: webhook {names.WEBHOOK_MUTATE_NAME} refused a pod naming no-such-template: "
                f'admission webhook "{names.WEBHOOK_MUTATE_NAME}" denied the request: '
                f'{names.ANN_TEMPLATE} "no-such-template" is not a valid template name'
            )
        ), ran.stdout
        assert not plane.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.strip()

        # The account may ask for dry runs only: a real create is refused by the policy.
        account = Credential(plane, cred)
        probe = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "real"},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/x"}]},
        }  # fmt: skip

        def refused() -> tuple[int, Any] | None:
            answer = account.request("POST", f"/api/v1/namespaces/{namespace}/pods", probe)
            if answer[0] == 201:
                plane.kubectl("delete", "pod", "real", "-n", namespace, "--wait=false")
                return None
            return answer

        status, body = wait_for("dry-run-only policy in effect", refused, timeout=30)
        assert status in (403, 422), body
        assert "may only ask for server-side dry runs" in body["message"], body

        # The webhook gone (its configuration still there): the test fails, saying so.
        stack.operator.kill(signal.SIGTERM)
        ran = _run_hook_script(plane, pod, namespace, cred, tmp_path, VNPU_TEST_TIMEOUT_SECONDS="1")
        assert ran.returncode == 1, ran.stdout + ran.stderr
        assert "FAIL: the vnpu-operator webhook did not answer" in ran.stdout, ran.stdout

        # No webhook configuration at all: the pod is admitted, and the test fails.
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME)
        ran = _run_hook_script(plane, pod, namespace, cred, tmp_path, VNPU_TEST_TIMEOUT_SECONDS="1")
        assert ran.returncode == 1, ran.stdout + ran.stderr
        assert "FAIL: a pod naming vnpu.io/template=no-such-template was admitted" in ran.stdout
    finally:
        stack.close()
        for (kind, name), _ in docs.items():
            if kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
                plane.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)


# ---------------------------------------------------------------- installed


@pytest.fixture(scope="module")
def release(plane: LocalPlane) -> Iterator[str]:
    """The chart installed into NAMESPACE, with two NPU nodes for the agents."""
    plane.kubectl("create", "namespace", NAMESPACE)
    plane.add_nodes(
        [
            NodeSpec(name=n, chips={"910B3": 2}, labels={names.LABEL_NPU_NODE: "true"})
            for n in (NODE_A, NODE_B)
        ]
    )
    adopt_crds(plane, NAMESPACE)
    # The release brings the protection policies for its own operator ServiceAccount.
    plane.remove_policies()
    helm(plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, *SIM_VALUES)
    yield RELEASE
    helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, check=False)
    plane.install_policies()


def test_install_creates_the_objects(plane: LocalPlane, release: str) -> None:
    deploy = get_json(plane, "deployment", f"{release}-operator", "-n", NAMESPACE)
    spec = deploy["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["vnpu-operator"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    metrics_port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    assert metrics_port == 9100
    assert c["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]
    assert pod["serviceAccountName"] == OPERATOR_SA

    ds = get_json(plane, "daemonset", f"{release}-agent", "-n", NAMESPACE)
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == AGENT_SA
    # kwok runs a (fake) agent pod on each NPU node.
    # At least ours: NPU nodes of earlier test modules may still be around.
    wait_for(
        "agents scheduled on both nodes",
        lambda: (
            get_json(plane, "daemonset", f"{release}-agent", "-n", NAMESPACE)
            .get("status", {})
            .get("desiredNumberScheduled", 0)
            >= 2
        ),
    )
    for node in (NODE_A, NODE_B):
        agent_pod(plane, node)

    for kind, name in [
        ("service", f"{release}-webhook"),
        ("service", f"{release}-operator-metrics"),
        ("service", f"{release}-agent-metrics"),
        ("serviceaccount", OPERATOR_SA),
        ("serviceaccount", AGENT_SA),
        ("role", f"{release}-agent"),
        ("rolebinding", f"{release}-agent"),
    ]:
        get_json(plane, kind, name, "-n", NAMESPACE)
    for kind, name in [
        ("clusterrole", f"{release}-operator"),
        ("clusterrole", f"{release}-agent"),
        ("mutatingwebhookconfiguration", names.WEBHOOK_CONFIG_NAME),
        ("validatingwebhookconfiguration", names.WEBHOOK_CONFIG_NAME),
        ("validatingadmissionpolicybinding", f"{release}-agent-node-scope"),
    ]:
        get_json(plane, kind, name)
    vap = wait_for(
        "the node-scope policy to be type-checked",
        lambda: (
            (v := get_json(plane, "validatingadmissionpolicy", f"{release}-agent-node-scope"))
            .get("status", {})
            .get("observedGeneration")
            and v
        ),
    )
    assert not vap["status"].get("typeChecking", {}).get("expressionWarnings"), vap["status"]
    crd = get_json(plane, "crd", f"{names.ALLOCATION_PLURAL}.{names.GROUP}")
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == release


ADMREG = "admissionregistration.k8s.io"
OPERATOR_ALLOWED = [
    ("get", "pods"),
    ("list", "pods"),
    ("watch", "pods"),
    ("patch", "pods"),
    ("patch", "pods/status"),
    *(
        (v, "vnpuallocations.vnpu.io")
        for v in ("get", "list", "watch", "create", "update", "patch", "delete")
    ),
    ("list", "vnpunodes.vnpu.io"),
    ("watch", "vnpunodes.vnpu.io"),
    ("list", "nodes"),
    ("watch", "nodes"),
    ("create", "events"),
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("patch", f"mutatingwebhookconfigurations.{ADMREG}/{names.WEBHOOK_CONFIG_NAME}"),
    ("patch", f"validatingwebhookconfigurations.{ADMREG}/{names.WEBHOOK_CONFIG_NAME}"),
]
OPERATOR_DENIED = [
    ("patch", "vnpuallocations.vnpu.io/status"),
    ("delete", "pods"),
    ("create", "pods"),
    ("update", "pods"),
    ("get", "secrets"),
    ("patch", "vnpunodes.vnpu.io"),
    ("patch", "vnpunodes.vnpu.io/status"),
    ("patch", "nodes"),
    ("create", "leases.coordination.k8s.io"),
    # Agent Leases are listed in the release namespace only, never watched.
    ("list", "leases.coordination.k8s.io"),
    ("watch", "leases.coordination.k8s.io"),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io/other"),
    ("delete", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
]
AGENT_ALLOWED = [
    ("list", "vnpuallocations.vnpu.io", None),
    ("watch", "vnpuallocations.vnpu.io", None),
    ("patch", "vnpuallocations.vnpu.io", None),
    ("patch", "vnpuallocations.vnpu.io/status", None),
    ("create", "vnpunodes.vnpu.io", None),
    ("list", "vnpunodes.vnpu.io", None),
    ("watch", "vnpunodes.vnpu.io", None),
    ("patch", "vnpunodes.vnpu.io", None),
    ("patch", "vnpunodes.vnpu.io/status", None),
    ("create", "leases.coordination.k8s.io", NAMESPACE),
    ("patch", "leases.coordination.k8s.io", NAMESPACE),
    ("create", "events", None),
    ("get", "nodes", None),
]
AGENT_DENIED = [
    ("delete", "pods", NAMESPACE),
    ("get", "pods", None),
    ("patch", "pods", None),
    ("create", "vnpuallocations.vnpu.io", None),
    ("delete", "vnpuallocations.vnpu.io", None),
    ("delete", "vnpunodes.vnpu.io", None),
    ("update", "vnpunodes.vnpu.io", None),
    ("create", "leases.coordination.k8s.io", "default"),
    ("list", "nodes", None),
    ("patch", "nodes", None),
    ("get", "secrets", NAMESPACE),
]


def test_operator_rbac(plane: LocalPlane, release: str) -> None:
    cred = token(plane, OPERATOR_SA)
    assert cred.whoami()["username"] == f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}"
    wrong = [(v, r) for v, r in OPERATOR_ALLOWED if not cred.can_i(v, r)]
    assert not wrong, f"operator lacks {wrong}"
    wrong = [(v, r) for v, r in OPERATOR_DENIED if cred.can_i(v, r)]
    assert not wrong, f"operator may {wrong}"
    leases = "leases.coordination.k8s.io"
    assert cred.can_i("list", leases, NAMESPACE)
    assert not cred.can_i("watch", leases, NAMESPACE)
    assert not cred.can_i("patch", leases, NAMESPACE)


def test_agent_rbac(plane: LocalPlane, release: str) -> None:
    cred = token(
        plane,
        AGENT_SA,
        "--bound-object-kind=Pod",
        f"--bound-object-name={agent_pod(plane, NODE_A)}",
    )
    wrong = [(v, r, ns) for v, r, ns in AGENT_ALLOWED if not cred.can_i(v, r, ns)]
    assert not wrong, f"agent lacks {wrong}"
    wrong = [(v, r, ns) for v, r, ns in AGENT_DENIED if cred.can_i(v, r, ns)]
    assert not wrong, f"agent may {wrong}"
    # A real request, not only the authorizer's opinion.
    status, body = cred.request(
        "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{agent_pod(plane, NODE_B)}"
    )
    assert status == 403, body


def _allocation(namespace: str, node: str) -> dict[str, Any]:
    uid = str(uuid.uuid4())
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": f"alloc-{node}",
            "namespace": namespace,
            "labels": {names.LABEL_NODE: node, names.LABEL_POD_UID: uid},
            "finalizers": [names.ALLOCATION_FINALIZER],
        },
        "spec": {
            "podName": "p",
            "podUID": uid,
            "nodeName": node,
            "chip": 0,
            "template": "vir05_1c_16g",
            "vnpuId": 100,
        },
    }


def test_agent_is_scoped_to_its_node(
    plane: LocalPlane, release: str, namespace: str, request: pytest.FixtureRequest
) -> None:
    base = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.ALLOCATION_PLURAL}"
    # Only the operator creates allocations (the chart's allocation-protection policy).
    operator = token(plane, OPERATOR_SA)
    for node in (NODE_A, NODE_B):
        status, body = operator.request("POST", base, _allocation(namespace, node))
        assert status == 201, body

    def release_by_hand() -> None:
        # No agent process serves these kwok nodes: left with their finalizers the
        # objects would outlive the test (and later tests expect none anywhere).
        for node in (NODE_A, NODE_B):
            name = f"alloc-{node}"
            patch = '{"metadata":{"finalizers":null}}'
            plane.kubectl("patch", names.ALLOCATION_PLURAL, name, "-n", namespace,
                          "--type=merge", "-p", patch, check=False)  # fmt: skip
            plane.kubectl("delete", names.ALLOCATION_PLURAL, name, "-n", namespace,
                          "--ignore-not-found", "--wait=false", check=False)  # fmt: skip

    request.addfinalizer(release_by_hand)
    # The credential the agent pod on NODE_A really gets: its projected token carries
    # the node name (ServiceAccountTokenPodNodeInfo, on by default in 1.34).
    agent = token(
        plane,
        AGENT_SA,
        "--bound-object-kind=Pod",
        f"--bound-object-name={agent_pod(plane, NODE_A)}",
    )
    extra = agent.whoami()["extra"]
    assert extra["authentication.kubernetes.io/node-name"] == [NODE_A]

    ready = {"status": {"phase": names.PHASE_READY}}
    status, body = agent.request("PATCH", f"{base}/alloc-{NODE_A}/status", ready, MERGE)
    assert status == 200, body
    assert body["status"]["phase"] == names.PHASE_READY

    # The API server takes a policy installed by the release into effect a
    # moment later (asynchronously): the first refusal is waited for.
    def refused() -> tuple[int, Any] | None:
        answer = agent.request("PATCH", f"{base}/alloc-{NODE_B}/status", ready, MERGE)
        return answer if answer[0] != 200 else None

    status, body = wait_for("node-scoping policy in effect", refused, timeout=30, interval=0.5)
    assert status == 403, body
    assert f"may only change allocations labelled vnpu.io/node={NODE_A}" in body["message"]
    status, body = agent.request(
        "PATCH", f"{base}/alloc-{NODE_B}", {"metadata": {"finalizers": None}}, MERGE
    )
    assert status == 403, body
    # Relabelling its own allocation to another node is refused too.
    status, body = agent.request(
        "PATCH",
        f"{base}/alloc-{NODE_A}",
        {"metadata": {"labels": {names.LABEL_NODE: NODE_B}}},
        MERGE,
    )
    # Two policies refuse it: node scoping (403, not its node) and allocation
    # protection (422, label must equal spec.nodeName); the API server may
    # answer with either first.
    assert status in (403, 422), body
    assert names.LABEL_NODE in body["message"], body
    # Removing the finalizer of its own allocation (what a release does) is allowed.
    status, body = agent.request(
        "PATCH",
        f"{base}/alloc-{NODE_A}",
        [{"op": "remove", "path": "/metadata/finalizers/0"}],
        JSON_PATCH,
    )
    assert status == 200, body

    nodes = f"/apis/{names.API_VERSION}/{names.NODE_PLURAL}"
    for node, expected in ((NODE_A, 201), (NODE_B, 403)):
        status, body = agent.request(
            "POST",
            nodes,
            {
                "apiVersion": names.API_VERSION,
                "kind": names.NODE_KIND,
                "metadata": {"name": node, "labels": {names.LABEL_NODE: node}},
            },
        )
        assert status == expected, body
    status, body = agent.request("PATCH", f"{nodes}/{NODE_A}/status", {"status": {}}, MERGE)
    assert status == 200, body
    # Its VNPUNode keeps the label vnpu.io/node=<its node>: the agent may put it back after
    # someone removed it, never remove it or point it at another node.
    label: dict[str, Any] = {"metadata": {"labels": {names.LABEL_NODE: None}}}
    status, body = agent.request("PATCH", f"{nodes}/{NODE_A}", label, MERGE)
    assert status == 403, body
    assert f"labelled vnpu.io/node={NODE_A}" in body["message"]
    label = {"metadata": {"labels": {names.LABEL_NODE: NODE_B}}}
    status, body = agent.request("PATCH", f"{nodes}/{NODE_A}", label, MERGE)
    assert status == 403, body
    plane.kubectl("label", names.NODE_PLURAL, NODE_A, f"{names.LABEL_NODE}-")
    status, body = agent.request("PATCH", f"{nodes}/{NODE_A}/status", {"status": {}}, MERGE)
    assert status == 200, body
    label = {"metadata": {"labels": {names.LABEL_NODE: NODE_A}}}
    status, body = agent.request("PATCH", f"{nodes}/{NODE_A}", label, MERGE)
    assert status == 200, body
    assert body["metadata"]["labels"] == {names.LABEL_NODE: NODE_A}

    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    for node, expected in ((NODE_A, 201), (NODE_B, 403)):
        status, body = agent.request(
            "POST",
            leases,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": names.lease_name(node)},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
            },
        )
        assert status == expected, body

    # A node-bound token (kubectl create token --bound-object-kind Node) carries the claim too.
    node_b = token(plane, AGENT_SA, "--bound-object-kind=Node", f"--bound-object-name={NODE_B}")
    status, body = node_b.request("PATCH", f"{base}/alloc-{NODE_B}/status", ready, MERGE)
    assert status == 200, body
    status, body = node_b.request("PATCH", f"{base}/alloc-{NODE_A}/status", ready, MERGE)
    assert status == 403, body

    # A token bound to nothing has no node: the agent's identity is refused every write.
    unbound = token(plane, AGENT_SA)
    status, body = unbound.request("PATCH", f"{base}/alloc-{NODE_A}/status", ready, MERGE)
    assert status == 403, body
    assert "node-name claim" in body["message"]

    plane.kubectl("delete", names.NODE_PLURAL, NODE_A)
    plane.kubectl("delete", "lease", names.lease_name(NODE_A), "-n", NAMESPACE)
    plane.kubectl(
        "patch",
        names.ALLOCATION_PLURAL,
        f"alloc-{NODE_B}",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )


def test_only_admins_cordon_chips(
    plane: LocalPlane, release: str, namespace: str, request: pytest.FixtureRequest
) -> None:
    """spec.cordonedChips of a VNPUNode is the admins': an agent's credential can
    change it on no node (another node's, nor its own), and neither can a namespace
    user; the status subresource never carries it."""
    nodes = f"/apis/{names.API_VERSION}/{names.NODE_PLURAL}"
    for node in (NODE_A, NODE_B):
        plane.kubectl("delete", names.NODE_PLURAL, node, "--ignore-not-found")
        manifest = {
            "apiVersion": names.API_VERSION,
            "kind": names.NODE_KIND,
            "metadata": {"name": node, "labels": {names.LABEL_NODE: node}},
        }
        plane.kubectl("create", "-f", "-", input=json.dumps(manifest))

    def cleanup() -> None:
        for node in (NODE_A, NODE_B):
            plane.kubectl("delete", names.NODE_PLURAL, node, "--ignore-not-found", check=False)

    request.addfinalizer(cleanup)
    agent = token(plane, AGENT_SA, "--bound-object-kind=Node", f"--bound-object-name={NODE_A}")
    cordon = {"spec": {"cordonedChips": [{"chip": 0, "reason": "agent says so"}]}}

    # The API server takes the release's policy into effect a moment later.
    def refused() -> tuple[int, Any] | None:
        answer = agent.request("PATCH", f"{nodes}/{NODE_B}", cordon, MERGE)
        return answer if answer[0] != 200 else None

    status, body = wait_for("node-scoping policy in effect", refused, timeout=30, interval=0.5)
    assert status == 403, body
    assert f"may only change VNPUNode {NODE_A}" in body["message"]
    # Nor its own node's chips: the cordon is an admin's decision, not the agent's.
    status, body = agent.request("PATCH", f"{nodes}/{NODE_A}", cordon, MERGE)
    assert status == 403, body
    assert "may not change the spec of a VNPUNode" in body["message"]
    # A status write leaves the spec alone, whatever its body says.
    status, body = agent.request("PATCH", f"{nodes}/{NODE_A}/status", cordon, MERGE)
    assert status == 200, body
    assert "cordonedChips" not in (body.get("spec") or {})
    # Recreating its VNPUNode with a cordon is refused too (its own plain create is not).
    plane.kubectl("delete", names.NODE_PLURAL, NODE_A)
    created = {
        "apiVersion": names.API_VERSION,
        "kind": names.NODE_KIND,
        "metadata": {"name": NODE_A, "labels": {names.LABEL_NODE: NODE_A}},
    }
    status, body = agent.request("POST", nodes, {**created, **cordon})
    assert status == 403, body
    status, body = agent.request("POST", nodes, created)
    assert status == 201, body

    # A namespace user, even the namespace's admin, has no say over cluster-scoped VNPUNodes.
    plane.kubectl("create", "serviceaccount", "ns-admin", "-n", namespace)
    plane.kubectl(
        "create", "rolebinding", "ns-admin", "-n", namespace, "--clusterrole=admin",
        f"--serviceaccount={namespace}:ns-admin",
    )  # fmt: skip
    user = Credential(
        plane,
        plane.kubectl("create", "token", "ns-admin", "-n", namespace).stdout.strip(),
    )
    status, body = user.request("PATCH", f"{nodes}/{NODE_B}", cordon, MERGE)
    assert status == 403, body

    # A namespace user reads its own namespace's allocations (tenantRead: aggregated into
    # view, edit and admin), no other namespace's, and writes none of them.
    own = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.ALLOCATION_PLURAL}"
    wait_for("the aggregated read to reach admin", lambda: user.request("GET", own)[0] == 200)
    status, body = user.request("GET", f"/apis/{names.API_VERSION}/{names.ALLOCATION_PLURAL}")
    assert status == 403, body
    status, body = user.request("DELETE", own)
    assert status == 403, body

    # The admin cordons with a plain patch, and kubectl get shows it.
    admin_cordon = {"spec": {"cordonedChips": [{"chip": 1, "reason": "ECC errors"}]}}
    plane.kubectl(
        "patch", names.NODE_PLURAL, NODE_B, "--type=merge", "-p", json.dumps(admin_cordon)
    )
    got = get_json(plane, names.NODE_PLURAL, NODE_B)
    assert got["spec"]["cordonedChips"] == [{"chip": 1, "reason": "ECC errors"}]


def _maybe_pod(plane: LocalPlane, name: str) -> dict[str, Any] | None:
    proc = plane.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def test_the_critical_pod_quota_counts_the_agent_pods(plane: LocalPlane, release: str) -> None:
    """The quota's scope matches the agents' priority class: the quota controller counts
    exactly those pods, which is what admits them where the class is limited."""
    quota = f"{release}-critical-pods"

    def counted() -> int | None:
        agents = get_json(
            plane, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent"
        )["items"]
        used = plane.quota_used(NAMESPACE, quota).get("pods")
        return len(agents) if agents and used == str(len(agents)) else None

    assert wait_for("the quota to count the agent pods", counted) >= 2
    # The operator (no priority class) is not counted.
    operator_pods = get_json(
        plane, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator"
    )["items"]
    assert operator_pods


def test_agents_follow_the_ascend_and_nfd_labels_and_tolerate_the_npu_taint(
    plane: LocalPlane, release: str, request: pytest.FixtureRequest
) -> None:
    ascend, nfd, plain = "chart-ascend-910", "chart-nfd", "chart-plain"
    plane.add_nodes([
        NodeSpec(
            name=ascend,
            labels={"accelerator": "huawei-Ascend910"},
            taints=[{"key": "huawei.com/Ascend910", "value": "true", "effect": "NoSchedule"}],
        ),
        NodeSpec(name=nfd, labels={"feature.node.kubernetes.io/pci-1200_19e5.present": "true"}),
        NodeSpec(name=plain),
    ])  # fmt: skip

    def restore() -> None:
        helm(plane, "upgrade", release, str(CHART), "-n", NAMESPACE, *SIM_VALUES, check=False)
        for node in (ascend, nfd, plain):
            plane.kubectl("delete", "node", node, "--wait=false", check=False)

    request.addfinalizer(restore)
    helm(plane, "upgrade", release, str(CHART), "-n", NAMESPACE, *SIM_VALUES,
         "--set-json", 'agent.npuNodeLabels=["ascend","nfd"]')  # fmt: skip

    def nodes_with_agents() -> set[str]:
        pods = get_json(plane, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent")[
            "items"
        ]
        return {
            p["spec"].get("nodeName") for p in pods if not p["metadata"].get("deletionTimestamp")
        }

    # The vnpu.io/npu nodes lose their agents: that label is no longer asked for.
    wanted = {ascend, nfd}
    got = wait_for(
        "agents on the Ascend and NFD nodes only",
        lambda: (
            (found := nodes_with_agents()) >= wanted
            and not found & {NODE_A, NODE_B, plain}
            and found
        ),
    )
    assert plain not in got
    ds = get_json(plane, "daemonset", f"{release}-agent", "-n", NAMESPACE)
    assert ds["status"]["desiredNumberScheduled"] == len(got)


def test_helm_test_runs_the_hook_and_reports_a_webhook_that_does_not_answer(
    plane: LocalPlane, release: str, tmp_path: Path
) -> None:
    """`helm test` on the release. kwok runs no containers, so this test is the kubelet:
    it runs the hook pod's command (as its ServiceAccount, with its env) and writes the
    pod's phase from the exit code. The release's operator is a kwok pod that serves
    nothing, so the webhook cannot answer and the test must fail, saying why."""
    pod_name = f"{TEST_SA}-webhook"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            helm, plane, "test", release, "-n", NAMESPACE, "--timeout", "120s", check=False
        )
        pod = wait_for(
            "the hook pod to run",
            lambda: (
                (p := _maybe_pod(plane, pod_name)) and p["status"].get("phase") == "Running" and p
            ),
        )
        cred = plane.kubectl(
            "create", "token", TEST_SA, "-n", NAMESPACE, "--bound-object-kind=Pod",
            f"--bound-object-name={pod_name}",
        ).stdout.strip()  # fmt: skip
        ran = _run_hook_script(plane, pod, NAMESPACE, cred, tmp_path, VNPU_TEST_TIMEOUT_SECONDS="1")
        phase = "Succeeded" if ran.returncode == 0 else "Failed"
        terminated = {"exitCode": ran.returncode, "reason": "Completed" if phase == "Succeeded"
                      else "Error"}  # fmt: skip
        status = {"status": {"phase": phase, "containerStatuses": [{
            "name": "check-webhook", "image": pod["spec"]["containers"][0]["image"],
            "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": terminated},
        }]}}  # fmt: skip
        plane.kubectl("patch", "pod", pod_name, "-n", NAMESPACE, "--subresource=status",
                      "--type=merge", "-p", json.dumps(status))  # fmt: skip
        outcome = running.result(timeout=180)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "FAIL: the vnpu-operator webhook did not answer" in ran.stdout, ran.stdout
    assert outcome.returncode != 0, outcome.stdout
    assert pod_name in outcome.stderr, outcome.stderr
    assert "failed" in outcome.stderr, outcome.stderr
    # Its ServiceAccount, Role and binding belong to the release; the failed pod stays to
    # be read.
    for kind in ("serviceaccount", "role", "rolebinding"):
        assert plane.kubectl("get", kind, TEST_SA, "-n", NAMESPACE, check=False).returncode == 0
    assert get_json(plane, "pod", pod_name, "-n", NAMESPACE)["status"]["phase"] == "Failed"
    plane.kubectl("delete", "pod", pod_name, "-n", NAMESPACE, "--wait=false")


def test_upgrade_keeps_the_ca_bundle_the_operator_registered(
    plane: LocalPlane, release: str
) -> None:
    # What the operator does at start: register its self-generated CA.
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        plane.kubectl(
            "patch",
            kind,
            names.WEBHOOK_CONFIG_NAME,
            "--type=json",
            "-p",
            json.dumps(
                [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Zm9v"}]
            ),
        )
    helm(
        plane,
        "upgrade",
        release,
        str(CHART),
        "-n",
        NAMESPACE,
        *SIM_VALUES,
        "--set",
        "operator.logLevel=DEBUG",
    )
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        obj = get_json(plane, kind, names.WEBHOOK_CONFIG_NAME)
        assert obj["webhooks"][0]["clientConfig"]["caBundle"] == "Zm9v", kind
    deploy = get_json(plane, "deployment", f"{release}-operator", "-n", NAMESPACE)
    env = {
        e["name"]: e.get("value")
        for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["VNPU_LOG_LEVEL"] == "DEBUG"


def test_uninstall_leaves_nothing_but_the_crds(plane: LocalPlane, release: str) -> None:
    helm(plane, "uninstall", release, "-n", NAMESPACE, "--wait", "--timeout=120s")
    selector = f"app.kubernetes.io/instance={release}"
    left = plane.kubectl(
        "get", "deploy,ds,svc,sa,role,rolebinding", "-n", NAMESPACE, "-l", selector, "-o", "name"
    ).stdout.split()
    assert not left, left
    cluster = plane.kubectl(
        "get",
        "clusterrole,clusterrolebinding,mutatingwebhookconfiguration,"
        "validatingwebhookconfiguration,validatingadmissionpolicy,"
        "validatingadmissionpolicybinding",
        "-l",
        selector,
        "-o",
        "name",
    ).stdout.split()
    assert not cluster, cluster
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        proc = plane.kubectl("get", kind, names.WEBHOOK_CONFIG_NAME, check=False)
        assert proc.returncode != 0
        assert "NotFound" in proc.stderr
    wait_for(
        "agent pods gone",
        lambda: (
            not get_json(plane, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent")[
                "items"
            ]
        ),
    )
    # The CRDs (and so every allocation) survive the uninstall.
    for crd in (f"{names.ALLOCATION_PLURAL}.{names.GROUP}", f"{names.NODE_PLURAL}.{names.GROUP}"):
        get_json(plane, "crd", crd)
