"""The chart's hardening values rendered and validated by the plane's API server
(docs/HELM.md, "A hardened install"): what each turns on, what a bad value says,
and that the defaults stay as they were. The install itself, on the real kubelet,
is test_real_node_hardened.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chart_harness import CHART, RELEASE, SIM_VALUES, helm, render, template

from localplane import LocalPlane

pytestmark = pytest.mark.plane

MONITORING = ("--api-versions", "monitoring.coreos.com/v1")
HARDENED = (
    *SIM_VALUES,
    "--set", "podSecurity.manageNamespace=true",
    "--set", "networkPolicy.enabled=true",
    "--set", "networkPolicy.webhook.from[0].ipBlock.cidr=10.0.0.10/32",
    "--set-json", 'networkPolicy.metrics.from=[{"namespaceSelector":{"matchLabels":'
    '{"kubernetes.io/metadata.name":"monitoring"}}}]',
    "--set", "metrics.auth=kubernetes",
    "--set-json", 'metrics.scrapers=[{"kind":"ServiceAccount","name":"prometheus",'
    '"namespace":"monitoring"}]',
    "--set", "metrics.podNames=false",
    "--set", "agent.validator.enabled=true",
    "--set", "metrics.serviceMonitor.enabled=true",
)  # fmt: skip


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = by_kind(docs, kind).values()
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_defaults_serve_metrics_in_plain_http_with_probes_beside_them(
    plane: LocalPlane,
) -> None:
    docs = render(plane, *SIM_VALUES)
    for kind in ("Deployment", "DaemonSet"):
        spec = pod_spec(docs, kind)
        (container,) = spec["containers"]
        assert env(container)["VNPU_METRICS_AUTH"] == "none"
        assert env(container)["VNPU_METRICS_HOST"] == "0.0.0.0"
        assert env(container)["VNPU_METRICS_POD_NAMES"] == "true"
        assert "VNPU_PROBE_PORT" not in env(container)
        assert container["readinessProbe"]["httpGet"]["port"] == "metrics"
        assert "initContainers" not in spec
    assert not by_kind(docs, "NetworkPolicy")
    assert f"{RELEASE}-pod-security" not in by_kind(docs, "Job")
    assert pod_spec(docs, "Deployment")["priorityClassName"] == "system-cluster-critical"


def test_hardened_values_reach_the_components(plane: LocalPlane) -> None:
    docs = render(plane, *HARDENED, *MONITORING)
    ports = {"Deployment": 8081, "DaemonSet": 9102}
    for kind, probe_port in ports.items():
        spec = pod_spec(docs, kind)
        container = spec["containers"][0]
        assert env(container)["VNPU_METRICS_AUTH"] == "kubernetes"
        assert env(container)["VNPU_METRICS_POD_NAMES"] == "false"
        assert env(container)["VNPU_PROBE_PORT"] == str(probe_port)
        declared = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert declared["probes"] == probe_port
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["port"] == "probes"
    # The validator runs the agent's own settings.
    agent = pod_spec(docs, "DaemonSet")
    (validate,) = agent["initContainers"]
    assert validate["command"] == ["vnpu-agent", "check"]
    assert validate["terminationMessagePolicy"] == "FallbackToLogsOnError"
    for field in ("env", "securityContext", "volumeMounts", "image"):
        assert validate[field] == agent["containers"][0][field], field
    # Prometheus scrapes over TLS with its own token.
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    # The scraper's role is get on /metrics, bound to the named account only.
    reader = by_kind(docs, "ClusterRole")[f"{RELEASE}-metrics-reader"]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = by_kind(docs, "ClusterRoleBinding")[f"{RELEASE}-metrics-reader"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    ]


def test_the_pod_security_hook_checks_the_agents_own_security_context(
    plane: LocalPlane,
) -> None:
    for driver in ("sim", "dcmi"):
        docs = render(plane, *HARDENED, "--set", f"agent.driver={driver}")
        job = by_kind(docs, "Job")[f"{RELEASE}-pod-security"]
        assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "-m", "vnpu_operator.pod_security"]
        values = env(container)
        labels = json.loads(values["VNPU_POD_SECURITY_LABELS"])
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
        probe = json.loads(values["VNPU_AGENT_PROBE_POD"])
        agent = pod_spec(docs, "DaemonSet")["containers"][0]
        assert probe["containers"][0]["securityContext"] == agent["securityContext"], driver
        assert probe["volumes"][0]["hostPath"]["path"] == "/var/lib/vnpu-agent"
        # The hook itself meets `restricted`: it runs before the namespace is relabelled.
        hook_pod = job["spec"]["template"]["spec"]
        assert hook_pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_network_policies_need_the_api_servers_addresses(plane: LocalPlane) -> None:
    refused = template(plane, *SIM_VALUES, "--set", "networkPolicy.enabled=true", check=False)
    assert refused.returncode != 0
    assert "networkPolicy.enabled=true needs networkPolicy.webhook.from" in refused.stderr
    docs = render(plane, *HARDENED)
    policies = by_kind(docs, "NetworkPolicy")
    operator = policies[f"{RELEASE}-operator"]["spec"]
    assert [r["ports"][0]["port"] for r in operator["ingress"]] == ["webhook", "metrics"]
    assert operator["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    # Without a scraper named, nobody reaches the agents' metrics.
    bare = render(
        plane, *SIM_VALUES, "--set", "networkPolicy.enabled=true",
        "--set", "networkPolicy.webhook.from[0].ipBlock.cidr=10.0.0.10/32",
    )  # fmt: skip
    agent = by_kind(bare, "NetworkPolicy")[f"{RELEASE}-agent"]["spec"]
    assert agent["ingress"] == []
    assert agent["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("metrics.auth=tls", "at '/metrics/auth'"),
        ("podSecurity.enforce=open", "at '/podSecurity/enforce'"),
        ("podSecurity.version=1.34", "at '/podSecurity/version'"),
        ("metrics.scrapers[0].kind=Pod", "at '/metrics/scrapers/0"),
    ],
)
def test_the_schema_refuses_bad_hardening_values(
    plane: LocalPlane, setting: str, message: str
) -> None:
    proc = template(plane, *SIM_VALUES, "--set", setting, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_the_hardened_render_passes_server_side_validation(
    plane: LocalPlane, namespace: str
) -> None:
    out = template(plane, *HARDENED, "--skip-tests", namespace=namespace).stdout
    proc = plane.kubectl("apply", "--dry-run=server", "-f", "-", input=out, check=False,
                         timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "networkpolicy.networking.k8s.io/vnpu-operator-operator created (server dry run)" in (
        proc.stdout
    )


def test_notes_say_the_effective_pod_security_level(plane: LocalPlane, namespace: str) -> None:
    def notes(*values: str) -> str:
        proc = helm(
            plane, "install", "notes", str(CHART), "-n", namespace, "--dry-run=server",
            "--set", "crds.install=false", *SIM_VALUES, *values,
        )  # fmt: skip
        return proc.stdout.split("NOTES:", 1)[1]

    plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce-")
    unlabelled = notes()
    assert "has no enforce label, so the cluster's default" in unlabelled, unlabelled
    plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    try:
        baseline = notes()
        assert "WARNING: namespace" in baseline
        assert 'enforces Pod Security "baseline"' in baseline
        managed = notes("--set", "podSecurity.manageNamespace=true")
        assert 'enforces "privileged"\n(podSecurity values; the install hook' in managed, managed
    finally:
        plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce-")
