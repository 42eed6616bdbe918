"""The Helm chart rendered (`helm template`, `helm lint`) and checked against a real
kube-apiserver: lint, the CRDs it ships, the values schema, server-side validation of
what it renders and the settings that reach the components, the clusters people run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, NAMESPACE, RELEASE, SIM_VALUES, helm, render, template

from localplane import LocalPlane
from release.version import project_version
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]


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
        ("operator.replicas=0", "at '/operator/replicas': minimum: got 0, want 1"),
        ("operator.leaderElection.leaseSeconds=1", "at '/operator/leaderElection/leaseSeconds'"),
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


DRA_API = ("--api-versions", "resource.k8s.io/v1/DeviceClass")
# DRA needs Kubernetes 1.36 (the chart refuses below); KUBE_VERSION is older.
DRA_KUBE = ("--kube-version", "1.36.0")
DRA_ON = ("--set", "agent.dra=true", *DRA_KUBE)
SPLIT = ("--set-json", 'agent.draNodeSelector={"vnpu.io/mode":"dra"}', *DRA_KUBE)


def test_dra_gives_the_agent_the_flag_its_rbac_and_the_device_class(
    plane: LocalPlane, namespace: str
) -> None:
    """agent.dra (docs/DRA.md): the agents get --dra (VNPU_DRA), RBAC on
    ResourceSlices and ResourceClaims, the node-scoping policy covers their
    slices, and the DeviceClass vnpu.io exists where resource.k8s.io/v1 is
    served. Off (the default), none of it."""

    def agent_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
        (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
        return {
            e["name"]: e.get("value")
            for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
        }

    def agent_rules(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
        (role,) = [
            d for d in docs
            if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "vnpu-operator-agent"
        ]  # fmt: skip
        return {
            f"{g}/{r}": rule["verbs"]
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
        }

    def scoped(docs: list[dict[str, Any]]) -> list[str]:
        (vap,) = [
            d for d in docs
            if d["kind"] == "ValidatingAdmissionPolicy"
            and d["metadata"]["name"].endswith("node-scope")
        ]  # fmt: skip
        return [
            r
            for rule in vap["spec"]["matchConstraints"]["resourceRules"]
            for r in rule["resources"]
        ]

    off = render(plane, *DRA_API)
    assert "VNPU_DRA" not in agent_env(off)
    assert not [k for k in agent_rules(off) if k.startswith("resource.k8s.io/")]
    assert "resourceslices" not in scoped(off)
    assert not [d for d in off if d["kind"] == "DeviceClass"]

    on = render(plane, *DRA_ON, *DRA_API)
    assert agent_env(on)["VNPU_DRA"] == "true"
    rules = agent_rules(on)
    assert rules["resource.k8s.io/resourceslices"] == [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ]  # fmt: skip
    assert rules["resource.k8s.io/resourceclaims"] == ["get", "list", "watch"]
    assert "resourceslices" in scoped(on)
    classes = {d["metadata"]["name"]: d for d in on if d["kind"] == "DeviceClass"}
    cls = classes.pop(names.DRA_DEVICE_CLASS)
    assert cls["apiVersion"] == "resource.k8s.io/v1"
    assert cls["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "vnpu.io"'}}]
    assert "extendedResourceName" not in cls["spec"]
    # One class per template of the catalog, each its template's extended resource.
    small = classes[names.template_device_class("vir05_1c_16g")]
    assert small["spec"] == {
        "selectors": [{"cel": {"expression": 'device.driver == "vnpu.io" && '
                               'device.attributes["vnpu.io"].template == "vir05_1c_16g"'}}],
        "extendedResourceName": names.template_resource("vir05_1c_16g"),
    }  # fmt: skip
    served = {c["spec"]["extendedResourceName"] for c in classes.values()}
    assert len(served) == len(classes) == 18
    assert not served & set(names.EXTENDED_RESOURCES)  # the charges are on no class
    (deploy,) = [d for d in on if d["kind"] == "Deployment"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    operator_env = {e["name"]: e.get("value") for e in container["env"]}
    assert operator_env["VNPU_DRA_EXTENDED_RESOURCES"] == "true"
    off_er = render(plane, *DRA_ON, *DRA_API, "--set", "dra.extendedResources=false")
    assert [d["metadata"]["name"] for d in off_er if d["kind"] == "DeviceClass"] == ["vnpu.io"]
    bad = template(plane, *DRA_ON, *DRA_API, "--set", "dra.templates={vir05_1c_16g,Vir01}",
                   check=False)  # fmt: skip
    assert bad.returncode != 0
    assert "Vir01" in bad.stderr

    # Not served (Kubernetes < 1.34, or not named to helm template): no class.
    assert not [d for d in render(plane, *DRA_ON) if d["kind"] == "DeviceClass"]
    no_class = render(plane, *DRA_ON, "--set", "dra.deviceClass=false", *DRA_API)
    no_class_names = [d["metadata"]["name"] for d in no_class if d["kind"] == "DeviceClass"]
    assert names.DRA_DEVICE_CLASS not in no_class_names  # the per-template ones stay
    assert len(no_class_names) == 18

    # What the API server makes of it (the plane serves resource.k8s.io/v1). A
    # class an earlier module applied (the DRA tests share the plane) goes first.
    plane.kubectl("delete", "deviceclasses.resource.k8s.io", names.DRA_DEVICE_CLASS,
                  "--ignore-not-found")  # fmt: skip
    out = template(
        plane, *SIM_VALUES, *DRA_ON, *DRA_API, "--skip-tests",
        namespace=namespace,
    ).stdout  # fmt: skip
    proc = plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=out, check=False, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "deviceclass.resource.k8s.io/vnpu.io created (server dry run)" in proc.stdout
    assert "deviceclass.resource.k8s.io/vir05-1c-16g.vnpu.io created (server dry run)" in (
        proc.stdout
    )


def _kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _env(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def _rules(docs: list[dict[str, Any]], name: str) -> dict[str, list[str]]:
    (role,) = [d for d in _kinds(docs, "ClusterRole") if d["metadata"]["name"] == name]
    return {
        f"{g}/{r}": rule["verbs"]
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }


@pytest.mark.parametrize("version", ["1.30.0", "1.34.4", "1.35.9"])
@pytest.mark.parametrize(
    "dra", [("--set", "agent.dra=true"), SPLIT[:2]], ids=["agent.dra", "draNodeSelector"]
)
def test_dra_is_refused_below_kubernetes_1_36(
    plane: LocalPlane, version: str, dra: tuple[str, ...]
) -> None:
    """Partitionable devices and binding conditions are off below 1.36: the scheduler would
    hand out vNPUs without their counters, and bind pods before their vNPU exists. Helm
    says so instead of installing it."""
    proc = template(plane, *dra, "--kube-version", version, check=False)
    assert proc.returncode != 0
    assert "need Kubernetes 1.36 or later" in proc.stderr, proc.stderr
    assert f"this cluster is v{version}" in proc.stderr, proc.stderr
    # Without DRA the same cluster installs; with it, 1.36 and later do (a vendor's
    # pre-release suffix included).
    assert template(plane, "--kube-version", version).returncode == 0
    for newer in ("1.36.0", "1.36.2-gke.1100", "1.37.2"):
        assert template(plane, *dra, "--kube-version", newer).returncode == 0


def test_both_dra_switches_at_once_are_refused(plane: LocalPlane) -> None:
    proc = template(plane, *SPLIT, "--set", "agent.dra=true", check=False)
    assert proc.returncode != 0
    assert "set one of them" in proc.stderr, proc.stderr


def test_the_operator_serves_claims_and_has_dra_rbac_only_with_dra(plane: LocalPlane) -> None:
    """DRA off: the operator gets VNPU_DRA=false (it then neither lists nor watches
    ResourceClaims) and neither component any right on resource.k8s.io. On (either
    switch): claims, their status and driver subresource, and the slices it removes of a
    dead agent (list, watch, delete); the agents their pool (list and watch included:
    they watch their own slices) and the claims they prepare."""
    operator_role, agent_role = "vnpu-operator-operator", "vnpu-operator-agent"
    off = render(plane, *DRA_KUBE)
    (deploy,) = _kinds(off, "Deployment")
    assert _env(deploy)["VNPU_DRA"] == "false"
    for role in (operator_role, agent_role):
        assert not [k for k in _rules(off, role) if k.startswith("resource.k8s.io/")], role
    for on in (render(plane, *DRA_ON), render(plane, *SPLIT)):
        (deploy,) = _kinds(on, "Deployment")
        assert _env(deploy)["VNPU_DRA"] == "true"
        operator = {k: v for k, v in _rules(on, operator_role).items() if "resource.k8s.io" in k}
        assert operator == {
            "resource.k8s.io/resourceclaims": ["get", "list", "watch"],
            "resource.k8s.io/resourceclaims/status": ["patch"],
            "resource.k8s.io/resourceclaims/driver": [
                "arbitrary-node:patch", "arbitrary-node:update",
            ],
            "resource.k8s.io/resourceslices": ["list", "watch", "delete"],
        }  # fmt: skip
        agent = {k: v for k, v in _rules(on, agent_role).items() if "resource.k8s.io" in k}
        assert {"list", "watch"} <= set(agent["resource.k8s.io/resourceslices"])
        assert agent["resource.k8s.io/resourceclaims"] == ["get", "list", "watch"]


def _matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for e in term.get("matchExpressions", []):
        value = labels.get(e["key"])
        if e["operator"] == "In" and value not in e["values"]:
            return False
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
    return True


def _runs_on(ds: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's pods may run on a node with these labels (nodeSelector
    and required node affinity)."""
    spec = ds["spec"]["template"]["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    return required is None or any(_matches(t, labels) for t in required["nodeSelectorTerms"])


def test_dra_and_annotation_nodes_in_one_release_by_node_pool(
    plane: LocalPlane, namespace: str
) -> None:
    """agent.draNodeSelector: the NPU nodes it selects get DaemonSet <release>-agent-dra
    (DRA: VNPU_DRA, the kubelet's directories), the others the annotation agent of
    <release>-agent, whose selector and name are the ones a release without the split
    has (so turning it on rolls no annotation agent but its affinity). Every NPU node runs
    exactly one of them, whatever other labels it has; other nodes none."""
    docs = render(
        plane, "--set-json", 'agent.draNodeSelector={"vnpu.io/mode":"dra","pool":"b"}',
        "--set-json", 'agent.npuNodeLabels=["vnpu","ascend"]',
        "--set-json", 'agent.nodeSelector={"zone":"z1"}', *DRA_KUBE,
    )  # fmt: skip
    by_name = {d["metadata"]["name"]: d for d in _kinds(docs, "DaemonSet")}
    assert set(by_name) == {"vnpu-operator-agent", "vnpu-operator-agent-dra"}
    annotation, dra = by_name["vnpu-operator-agent"], by_name["vnpu-operator-agent-dra"]
    (plain,) = _kinds(render(plane), "DaemonSet")
    assert annotation["spec"]["selector"] == plain["spec"]["selector"]
    assert dra["spec"]["selector"]["matchLabels"]["vnpu.io/agent-mode"] == "dra"
    assert dra["spec"]["template"]["metadata"]["labels"]["vnpu.io/agent-mode"] == "dra"
    assert "VNPU_DRA" not in _env(annotation)
    assert _env(dra)["VNPU_DRA"] == "true"
    mounts = {v["name"] for v in dra["spec"]["template"]["spec"]["volumes"]}
    assert {"kubelet-plugins", "kubelet-plugins-registry"} <= mounts
    assert "kubelet-plugins" not in {
        v["name"] for v in annotation["spec"]["template"]["spec"]["volumes"]
    }
    # The metrics Service scrapes both.
    (svc,) = [d for d in _kinds(docs, "Service") if d["metadata"]["name"].endswith("agent-metrics")]
    assert svc["spec"]["selector"].items() <= dra["spec"]["template"]["metadata"]["labels"].items()
    assert (
        svc["spec"]["selector"].items()
        <= annotation["spec"]["template"]["metadata"]["labels"].items()
    )

    npu = ({"vnpu.io/npu": "true"}, {"accelerator": "huawei-Ascend910"})
    picked = {"vnpu.io/mode": "dra", "pool": "b"}
    cases = [
        *(({**n, "zone": "z1"}, "annotation") for n in npu),
        *(({**n, "zone": "z1", **picked}, "dra") for n in npu),
        ({"vnpu.io/npu": "true", "zone": "z1", "vnpu.io/mode": "dra"}, "annotation"),
        ({"vnpu.io/npu": "true", "zone": "z1", "pool": "b"}, "annotation"),
        ({"vnpu.io/npu": "true", "zone": "z1", "vnpu.io/mode": "other", "pool": "b"}, "annotation"),
        ({"vnpu.io/npu": "true", "zone": "z2", **picked}, None),  # agent.nodeSelector
        ({"zone": "z1", **picked}, None),  # not an NPU node
        ({"zone": "z1"}, None),
    ]
    for labels, expected in cases:
        runs = [
            mode for mode, ds in (("annotation", annotation), ("dra", dra)) if _runs_on(ds, labels)
        ]
        assert runs == ([expected] if expected else []), (labels, runs)

    # The API server takes both DaemonSets as rendered.
    out = template(plane, *SIM_VALUES, *SPLIT, *DRA_API, "--skip-tests", namespace=namespace).stdout
    proc = plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=out, check=False, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "daemonset.apps/vnpu-operator-agent-dra created (server dry run)" in proc.stdout


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ('agent.draNodeSelector={"bad key!":"x"}', "at '/agent/draNodeSelector'"),
        (
            'agent.draNodeSelector={"vnpu.io/mode":"not a value"}',
            "at '/agent/draNodeSelector/vnpu.io~1mode'",
        ),
        ('agent.hostPaths.kubeletPlugins="relative"', "at '/agent/hostPaths/kubeletPlugins'"),
        ('dra.extraDeviceClasses=["Not_A_Name"]', "at '/dra/extraDeviceClasses/0'"),
        (
            "metrics.prometheusRule.draPrepareP99Seconds=0",
            "at '/metrics/prometheusRule/draPrepareP99Seconds'",
        ),
    ],
)
def test_the_schema_refuses_bad_dra_values(plane: LocalPlane, setting: str, message: str) -> None:
    proc = template(plane, "--set-json", setting, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_the_kubelets_plugin_directories_are_values(plane: LocalPlane) -> None:
    """A kubelet with another root directory (k0s, microk8s): the agent gets the paths
    (VNPU_DRA_PLUGINS_DIR, VNPU_DRA_REGISTRY_DIR) and mounts them at the same paths,
    where the kubelet dials the socket the plugin registers."""

    def agent(*values: str) -> dict[str, Any]:
        (ds,) = _kinds(render(plane, *DRA_ON, *values), "DaemonSet")
        spec: dict[str, Any] = ds["spec"]["template"]["spec"]
        return spec

    k0s = "/var/lib/k0s/kubelet"
    for plugins, registry, values in (
        ("/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", ()),
        (
            f"{k0s}/plugins",
            f"{k0s}/plugins_registry",
            (
                "--set", f"agent.hostPaths.kubeletPlugins={k0s}/plugins",
                "--set", f"agent.hostPaths.kubeletPluginsRegistry={k0s}/plugins_registry",
            ),
        ),
    ):  # fmt: skip
        spec = agent(*values)
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env["VNPU_DRA_PLUGINS_DIR"], env["VNPU_DRA_REGISTRY_DIR"]) == (plugins, registry)
        volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        for name, path in (("kubelet-plugins", plugins), ("kubelet-plugins-registry", registry)):
            assert volumes[name] == mounts[name] == path
    # Off: no kubelet directory, no variable.
    (ds,) = _kinds(render(plane), "DaemonSet")
    assert "VNPU_DRA_PLUGINS_DIR" not in _env(ds)


def test_dra_alerts_only_with_dra(plane: LocalPlane) -> None:
    monitoring = ("--set", "metrics.prometheusRule.enabled=true", "--api-versions",
                  "monitoring.coreos.com/v1")  # fmt: skip

    def alerts(*values: str) -> dict[str, dict[str, Any]]:
        (rule,) = _kinds(render(plane, *monitoring, *values), "PrometheusRule")
        return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}

    dra_alerts = {
        "VNPUDRAPrepareErrors", "VNPUDRAPrepareSlow", "VNPUDRAPoolChurn",
        "VNPUDRAClaimsRefusedAgentDown",
    }  # fmt: skip
    assert not dra_alerts & set(alerts(*DRA_KUBE))
    assert dra_alerts <= set(alerts(*SPLIT))
    on = alerts(
        *DRA_ON, "--set", "metrics.prometheusRule.draPrepareErrorsFor=7m",
        "--set", "metrics.prometheusRule.draPrepareP99Seconds=40",
        "--set", "metrics.prometheusRule.draPoolWritesPerHour=12",
        "--set", "metrics.prometheusRule.draClaimsRefusedFor=20m",
    )  # fmt: skip
    assert on["VNPUDRAPrepareErrors"]["expr"] == (
        "sum by (node, op) (rate(vnpu_agent_dra_prepare_errors_total[5m])) > 0"
    )
    assert on["VNPUDRAPrepareErrors"]["for"] == "7m"
    assert "vnpu_agent_dra_prepare_seconds_bucket" in on["VNPUDRAPrepareSlow"]["expr"]
    assert on["VNPUDRAPrepareSlow"]["expr"].endswith("> 40")
    assert "45 s" in on["VNPUDRAPrepareSlow"]["annotations"]["description"]
    assert "vnpu_agent_dra_pool_writes_total" in on["VNPUDRAPoolChurn"]["expr"]
    assert on["VNPUDRAPoolChurn"]["expr"].endswith("> 12")
    refused = on["VNPUDRAClaimsRefusedAgentDown"]
    assert 'vnpu_operator_dra_claims_refused_total{reason="AgentDown"}' in refused["expr"]
    assert refused["for"] == "20m"
    for alert in dra_alerts:
        assert on[alert]["labels"]["severity"] == "warning"
        assert on[alert]["annotations"]["summary"]
    # Each description keeps Prometheus' own templates for Prometheus.
    assert "{{ $labels.node }}" in on["VNPUDRAPrepareErrors"]["annotations"]["description"]


def test_the_dra_admission_policies_follow_protection_and_the_device_classes(
    plane: LocalPlane,
) -> None:
    """Rendered with protection.enabled, DRA or not (a class selecting vnpu.io may exist
    without it); dra.extraDeviceClasses are guarded as vnpu.io is. What they refuse:
    test_dra_admission.py."""

    def policies(*values: str) -> dict[str, dict[str, Any]]:
        docs = render(plane, "--show-only", "templates/dra-admission.yaml", *values)
        return {d["metadata"]["name"]: d for d in _kinds(docs, "ValidatingAdmissionPolicy")}

    rendered = policies()
    assert set(rendered) == {
        f"{RELEASE}-dra-admin-access", f"{RELEASE}-dra-admin-access-templates",
        f"{RELEASE}-dra-extended-resource", f"{RELEASE}-dra-slice-deletes",
    }  # fmt: skip
    for policy in rendered.values():
        assert policy["spec"]["failurePolicy"] == "Fail"
        # Nobody is exempt, the operator not even (but from the slice check, which is its).
        if not policy["metadata"]["name"].endswith("slice-deletes"):
            assert "matchConditions" not in policy["spec"]
    pods = json.dumps(rendered[f"{RELEASE}-dra-extended-resource"]["spec"])
    assert f"deviceclass.resource.kubernetes.io/{names.DRA_DEVICE_CLASS}" in pods
    mine = policies("--set-json", 'dra.extraDeviceClasses=["npu.example.com"]')
    refused, _classes = mine[f"{RELEASE}-dra-admin-access"]["spec"]["variables"]
    # The chart's catch-all class, the admin's, then every per-template class.
    assert '["vnpu.io","npu.example.com","vir01.vnpu.io",' in refused["expression"]
    assert '"vir05-1c-16g.vnpu.io"' in refused["expression"]
    pods = json.dumps(mine[f"{RELEASE}-dra-extended-resource"]["spec"])
    assert "deviceclass.resource.kubernetes.io/npu.example.com" in pods
    proc = template(
        plane, "--show-only", "templates/dra-admission.yaml", "--set", "protection.enabled=false",
        check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "could not find template" in proc.stderr


def test_driver_host_mounts(plane: LocalPlane) -> None:
    def daemonset(*values: str) -> dict[str, Any]:
        (ds,) = [d for d in render(plane, *values) if d["kind"] == "DaemonSet"]
        return ds

    spec = daemonset("--set", "agent.driver=dcmi")["spec"]["template"]["spec"]
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    # dcmi needs no npu-smi on the host (a hostPath of type File fails the pod where the
    # file is missing).
    assert paths == {
        "/dev",
        "/usr/local/Ascend/driver",
        "/etc/vnpu.cfg",
        "/var/run/cdi",
        "/var/lib/vnpu-agent",
    }
    assert "VNPU_NPU_SMI_PATH" not in {e["name"] for e in spec["containers"][0]["env"]}
    npu_smi = daemonset("--set", "agent.driver=npu-smi")["spec"]["template"]["spec"]
    (tool,) = [v for v in npu_smi["volumes"] if v["name"] == "npu-smi"]
    assert tool["hostPath"] == {"path": "/usr/local/sbin/npu-smi", "type": "File"}
    env = {e["name"]: e.get("value") for e in npu_smi["containers"][0]["env"]}
    assert env["VNPU_NPU_SMI_PATH"] == "/usr/local/sbin/npu-smi"
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
    anti: dict[str, Any] = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
    }
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
            d["spec"]["template"]["spec"]
            for d in docs
            if d["kind"] in ("Deployment", "DaemonSet", "Job")  # Job: the pre-delete hook
        ]
        pods += [d["spec"] for d in docs if d["kind"] == "Pod"]  # the helm test hook
        assert len(pods) == 4
        return {c["image"] for p in pods for c in p["containers"]}

    assert images() == {f"vnpu-operator:{project_version(ROOT)}"}
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

    # The defaults: the agents at system-node-critical, the operator (whose webhook fails
    # closed) at system-cluster-critical.
    default = quota()
    assert default is not None
    (selector,) = default["spec"]["scopeSelector"]["matchExpressions"]
    assert selector == {
        "scopeName": "PriorityClass", "operator": "In",
        "values": ["system-node-critical", "system-cluster-critical"],
    }  # fmt: skip
    agents_only = quota("--set", "operator.priorityClassName=")
    assert agents_only is not None
    (selector,) = agents_only["spec"]["scopeSelector"]["matchExpressions"]
    assert selector["values"] == ["system-node-critical"]
    assert quota("--set", "criticalPodQuota.enabled=false") is None
    none = ("--set", "agent.priorityClassName=high", "--set", "operator.priorityClassName=")
    assert quota(*none) is None
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


def test_service_monitor_and_rules_only_where_their_api_is_served(plane: LocalPlane) -> None:
    """Both need the Prometheus Operator's CRDs: where they are missing the install would
    fail on an unknown kind, so neither is rendered (NOTES.txt says why)."""
    on = ("--set", "metrics.serviceMonitor.enabled=true", "--set",
          "metrics.prometheusRule.enabled=true")  # fmt: skip

    def kinds(*values: str) -> set[str]:
        return {d["kind"] for d in render(plane, *on, *values)}

    assert not {"ServiceMonitor", "PrometheusRule"} & kinds()
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds(
        "--api-versions", "monitoring.coreos.com/v1"
    )


def test_the_api_error_rate_alert(plane: LocalPlane) -> None:
    docs = render(plane, "--set", "metrics.prometheusRule.enabled=true",
                  "--set", "metrics.prometheusRule.apiErrorsFor=3m",
                  "--api-versions", "monitoring.coreos.com/v1")  # fmt: skip
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    alert = alerts["VNPUOperatorAPIErrors"]
    assert "vnpu_operator_api_errors_total" in alert["expr"]
    assert alert["expr"].endswith("> 0")
    assert alert["for"] == "3m"
    assert "WriteRefused" in alert["annotations"]["description"]


def test_one_replica_has_no_disruption_budget_and_no_leader_goes_alerted(
    plane: LocalPlane,
) -> None:
    """replicas 1 renders as before (no PDB: it would only block drains or permit what one
    replica allows anyway); the leader Lease's timing reaches the operator; the alert on
    no replica leading fires after noLeaderFor."""

    def kinds(*values: str) -> list[str]:
        return [d["kind"] for d in render(plane, *values)]

    assert "PodDisruptionBudget" in kinds()
    assert "PodDisruptionBudget" not in kinds("--set", "operator.replicas=1")
    (deploy,) = [
        d for d in render(plane, "--set", "operator.replicas=1") if d["kind"] == "Deployment"
    ]
    assert deploy["spec"]["replicas"] == 1
    docs = render(plane, "--set", "operator.leaderElection.leaseSeconds=30",
                  "--set", "metrics.prometheusRule.enabled=true",
                  "--set", "metrics.prometheusRule.noLeaderFor=2m",
                  "--api-versions", "monitoring.coreos.com/v1")  # fmt: skip
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["VNPU_LEADER_ELECTION_LEASE_SECONDS"] == "30"
    assert env["VNPU_LEADER_ELECTION_RENEW_DEADLINE_SECONDS"] == "3"
    assert env["VNPU_LEADER_ELECTION_RETRY_SECONDS"] == "0.5"
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    alert = alerts["VNPUOperatorNoLeader"]
    assert alert["expr"] == "max by (namespace) (vnpu_operator_leader) < 1"
    assert alert["for"] == "2m"


def test_the_release_notes_say_which_nodes_serve_claims(plane: LocalPlane, namespace: str) -> None:
    """What `helm install` prints (a server-side dry run against the 1.37 plane;
    a DeviceClass an earlier module applied would clash with the release's)."""
    plane.kubectl("delete", "deviceclasses.resource.k8s.io", names.DRA_DEVICE_CLASS,
                  "--ignore-not-found")  # fmt: skip

    def notes(*values: str) -> str:
        proc = helm(
            plane, "install", "notes", str(CHART), "-n", namespace, "--dry-run=server",
            "--set", "crds.install=false", *SIM_VALUES, *values,
        )  # fmt: skip
        return proc.stdout.split("NOTES:", 1)[1]

    split = notes("--set-json", 'agent.draNodeSelector={"vnpu.io/mode":"dra"}')
    assert "the nodes labelled vnpu.io/mode=dra serve ResourceClaims" in split, split
    assert "DaemonSet notes-vnpu-operator-agent-dra" in split, split
    assert "or with a ResourceClaim of DeviceClass vnpu.io" in split, split
    assert "deviceclass.resource.kubernetes.io/vnpu.io in a pod, are refused" in split, split
    every = notes("--set", "agent.dra=true")
    assert "They serve ResourceClaims of DeviceClass vnpu.io" in every, every
    plain = notes()
    assert "ResourceClaim" not in plain, plain
