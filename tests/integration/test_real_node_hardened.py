"""The hardened first install (docs/HELM.md, "A hardened install") on the real
kubelet: the chart's values for a shared cluster, and tenants whose namespaces
enforce Pod Security `baseline` and `restricted`.

The release namespace starts out enforcing `restricted`, as a careful admin's
default would; `podSecurity.manageNamespace` relabels it before anything else and
proves a pod like the agent's is admitted. NetworkPolicies are applied (the
node's bridge plugin does not enforce them: what is checked is that they are
accepted and select exactly the components' pods and ports). /metrics is served
over TLS to the named scraper's token only, names no tenant's pod, and the probes
answer on their own port. The agent starts after `vnpu-agent check` passed as an
init container. A vNPU pod in each tenant namespace gets exactly its vNPU
(`ls /dev`): the webhook's mutation keeps a restricted pod restricted.

Needs root (the real node, the image build). One release for the module.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, RELEASE, helm
from realnode_harness import check_devices, ready_for_release, running, vnpu_busybox_pod

from localplane import productimage
from localplane.chart import real_node_values
from localplane.plane import LocalPlane
from localplane.realnode import POD_GATEWAY, RealNode
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.realnode]

NAMESPACE = "vnpu-realnode-hardened"
BASELINE, RESTRICTED = "vnpu-hardened-baseline", "vnpu-hardened-restricted"
MONITORING = "vnpu-hardened-monitoring"
SCRAPER = "prometheus"
TENANT = "tenant"
RUNTIME_CLASS = "vnpu-ascend"
COMPONENT = "app.kubernetes.io/component"
PSA = "pod-security.kubernetes.io"
OPERATOR_METRICS, AGENT_METRICS = 9100, 9101


def component_pods(plane: LocalPlane, component: str) -> list[dict[str, Any]]:
    pods = plane.get_json("pods", "-n", NAMESPACE, "-l", f"{COMPONENT}={component}")
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def _all_ready(plane: LocalPlane, component: str) -> bool:
    pods = component_pods(plane, component)
    return bool(pods) and all(
        any(c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or [])
        for p in pods
    )  # fmt: skip


def _diagnose(plane: LocalPlane) -> str:
    parts = [plane.kubectl("get", "pods,jobs,events", "-n", NAMESPACE, check=False).stdout]
    for component in ("operator", "agent", "pod-security"):
        logs = plane.kubectl("logs", "-n", NAMESPACE, "-l", f"{COMPONENT}={component}",
                             "--all-containers", "--tail=40", check=False)  # fmt: skip
        parts.append(logs.stdout)
    return "\n---\n".join(parts)


@pytest.fixture(scope="module")
def hardened(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    workdir = Path(tmp_path_factory.mktemp("realnode-hardened"))
    image = productimage.build(progress=lambda line: print(line))
    real_node.import_image(image.archive)
    ready_for_release(plane, real_node, NAMESPACE, BASELINE, RESTRICTED, MONITORING)
    # The control device the Ascend runtime stand-in adds to every vNPU container.
    real_node.add_davinci_manager()
    # Where the release goes, a careful admin's default: restricted, which the agent fails.
    plane.kubectl("label", "namespace", NAMESPACE, f"{PSA}/enforce=restricted", "--overwrite")
    plane.kubectl("label", "namespace", BASELINE, f"{PSA}/enforce=baseline", "--overwrite")
    plane.kubectl("label", "namespace", RESTRICTED, f"{PSA}/enforce=restricted", "--overwrite")
    for ns, account in ((MONITORING, SCRAPER), (RESTRICTED, TENANT)):
        plane.kubectl("create", "serviceaccount", account, "-n", ns)
    # The tenant has the usual namespace rights.
    plane.kubectl("create", "rolebinding", "tenant-edit", "-n", RESTRICTED, "--clusterrole=edit",
                  f"--serviceaccount={RESTRICTED}:{TENANT}")  # fmt: skip
    values = real_node_values(
        plane, real_node, image, runtime_class=RUNTIME_CLASS, chips="910B3=1",
        state_dir=workdir / "agent-state", cdi_dir=workdir / "cdi",
    )  # fmt: skip
    values["operator"]["replicas"] = 1
    values["agent"]["validator"] = {"enabled": True}
    values["podSecurity"] = {"manageNamespace": True}
    values["networkPolicy"] = {
        "enabled": True,
        # The API server, as the pods reach it (and it them) on this node: the bridge's gateway.
        "webhook": {"from": [{"ipBlock": {"cidr": f"{POD_GATEWAY}/32"}}]},
        "metrics": {"from": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }]},
    }  # fmt: skip
    values["metrics"] = {
        "auth": "kubernetes",
        "podNames": False,
        "scrapers": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": MONITORING}],
    }
    (workdir / "values.yaml").write_text(yaml.safe_dump(values))
    installed = False
    try:
        t0 = time.monotonic()
        out = helm(plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f",
                   str(workdir / "values.yaml"), check=False)  # fmt: skip
        assert out.returncode == 0, f"{out.stderr}\n{_diagnose(plane)}"
        installed = True
        for component in ("operator", "agent"):
            try:
                wait_for(f"the {component} pods Ready", lambda c=component: _all_ready(plane, c),
                         180, interval=0.5)  # fmt: skip
            except AssertionError:
                raise AssertionError(_diagnose(plane)) from None
        print(f"[realnode-hardened] helm install to ready {time.monotonic() - t0:.1f}s")
        yield real_node
        for ns in (BASELINE, RESTRICTED):
            plane.kubectl("delete", "pods", "--all", "-n", ns, "--wait=false")
        wait_for("the tenants' allocations gone", lambda: not [
            a for a in plane.get_json("vnpuallocations", "-A")["items"]
            if a["metadata"]["namespace"] in (BASELINE, RESTRICTED)
        ], 120)  # fmt: skip
        helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s")
        installed = False
    finally:
        if installed:
            helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks", "--wait",
                 "--timeout=180s", check=False)  # fmt: skip
        plane.install_policies()
        plane.kubectl("label", "node", real_node.name, f"{names.LABEL_NPU_NODE}-", check=False)
        for ns in (BASELINE, RESTRICTED, MONITORING, NAMESPACE):
            plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_the_install_hook_relabels_the_namespace_and_notes_say_so(
    plane: LocalPlane, hardened: RealNode
) -> None:
    labels = plane.get_json("namespace", NAMESPACE)["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"{PSA}/{mode}"] == "privileged", labels
        assert labels[f"{PSA}/{mode}-version"] == "latest", labels
    # The hook and its rights went once it passed.
    assert not plane.get_json("jobs", "-n", NAMESPACE)["items"]
    leftover = plane.kubectl("get", "clusterrole", f"{RELEASE}-pod-security", check=False)
    assert leftover.returncode != 0, leftover.stdout
    notes = helm(plane, "get", "notes", RELEASE, "-n", NAMESPACE).stdout
    assert f'namespace {NAMESPACE} enforces "privileged"' in notes, notes
    # The operator runs at the critical class by default (the chart's quota let it in).
    (operator,) = component_pods(plane, "operator")
    assert operator["spec"]["priorityClassName"] == "system-cluster-critical"


def _restricted(pod: dict[str, Any]) -> dict[str, Any]:
    """A vnpu_busybox_pod that meets Pod Security `restricted`."""
    pod["spec"]["securityContext"] = {
        "runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        }  # fmt: skip
    return pod


@pytest.mark.parametrize("namespace", [BASELINE, RESTRICTED])
def test_a_tenant_pod_at_baseline_and_restricted_gets_exactly_its_vnpu(
    plane: LocalPlane, hardened: RealNode, namespace: str
) -> None:
    name = f"vnpu-{namespace.rsplit('-', 1)[1]}"
    pod = _restricted(vnpu_busybox_pod(name, namespace, 1))
    out = plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod), check=False)
    # Admitted after the webhook's mutation: what it adds keeps the pod at the level.
    assert out.returncode == 0, out.stderr
    assert "violate" not in out.stderr, out.stderr
    ran = running(plane, namespace, name, timeout=120)
    assert ran["spec"]["runtimeClassName"] == RUNTIME_CLASS
    ids = check_devices(plane, namespace, ran)
    assert len(ids) == 1
    # And a pod the level refuses stays refused: the webhook does not launder it.
    root = vnpu_busybox_pod(f"{name}-root", namespace, 1)
    root["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(root), check=False)
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr, refused.stderr


def test_network_policies_select_the_components_and_their_ports(
    plane: LocalPlane, hardened: RealNode
) -> None:
    policies = {
        p["metadata"]["name"]: p
        for p in plane.get_json("networkpolicies", "-n", NAMESPACE)["items"]
    }
    assert set(policies) == {f"{RELEASE}-operator", f"{RELEASE}-agent"}
    for component, policy in ((c, policies[f"{RELEASE}-{c}"]) for c in ("operator", "agent")):
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        selector = ",".join(f"{k}={v}" for k, v in spec["podSelector"]["matchLabels"].items())
        selected = plane.get_json("pods", "-n", NAMESPACE, "-l", selector)["items"]
        assert {p["metadata"]["name"] for p in selected} == {
            p["metadata"]["name"] for p in component_pods(plane, component)
        }
        ports = {port["port"]: rule["from"] for rule in spec["ingress"] for port in rule["ports"]}
        # Named ports: each is a port the selected pods' container declares.
        declared = {
            p["name"] for pod in selected for c in pod["spec"]["containers"] for p in c["ports"]
        }
        assert set(ports) <= declared, (ports, declared)
        scraper = ports["metrics"][0]
        assert scraper["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": MONITORING
        }
        if component == "operator":
            assert ports["webhook"] == [{"ipBlock": {"cidr": f"{POD_GATEWAY}/32"}}]
        else:
            assert set(ports) == {"metrics"}


def _scrape(ip: str, port: int, token: str | None, *, tls: bool = True) -> tuple[int, str]:
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    scheme = "https" if tls else "http"
    request = urllib.request.Request(f"{scheme}://{ip}:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, context=insecure if tls else None, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_answer_only_the_named_scraper_over_tls(
    plane: LocalPlane, hardened: RealNode
) -> None:
    scraper = plane.kubectl("create", "token", SCRAPER, "-n", MONITORING).stdout.strip()
    tenant = plane.kubectl("create", "token", TENANT, "-n", RESTRICTED).stdout.strip()
    # The tenant pods of the tests above run: their names could show up in a series.
    for component, port, prefix in (
        ("operator", OPERATOR_METRICS, "vnpu_operator_"),
        ("agent", AGENT_METRICS, "vnpu_agent_"),
    ):
        (pod,) = component_pods(plane, component)
        ip = pod["status"]["podIP"]
        assert _scrape(ip, port, None)[0] == 401, component
        status, body = _scrape(ip, port, tenant)
        assert status == 403, (component, body)
        assert prefix not in body
        status, body = _scrape(ip, port, scraper)
        assert status == 200, (component, body)
        assert prefix in body
        # metrics.podNames=false: no series names a tenant's pod.
        for tenant_pod in ("vnpu-baseline", "vnpu-restricted"):
            assert f'"{tenant_pod}"' not in body, (component, tenant_pod)
        if component == "agent":
            assert "vnpu_agent_allocation_info{" in body
            assert 'pod=""' in body
        # No token crosses in clear: the port speaks TLS only.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _scrape(ip, port, scraper, tls=False)
        # The kubelet probes the probe port in plain HTTP (the pods are Ready), and finds
        # no series there.
        probes = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        probe = pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        assert probe["port"] == "probes"
        with urllib.request.urlopen(f"http://{ip}:{probes['probes']}/readyz", timeout=10) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://{ip}:{probes['probes']}/metrics", timeout=10)
        assert missing.value.code == 404


def test_the_agent_started_after_its_node_passed_the_check(
    plane: LocalPlane, hardened: RealNode
) -> None:
    (agent,) = component_pods(plane, "agent")
    (validate,) = agent["status"]["initContainerStatuses"]
    assert validate["name"] == "validate"
    assert validate["state"]["terminated"]["exitCode"] == 0, validate
    report = plane.kubectl("logs", "-n", NAMESPACE, agent["metadata"]["name"], "-c", "validate")
    assert "910B3" in report.stdout, report.stdout
    # The same driver settings as the agent's own container: one definition, both places.
    spec = agent["spec"]
    init_env = {e["name"] for e in spec["initContainers"][0]["env"]}
    agent_env = {e["name"] for e in spec["containers"][0]["env"]}
    assert init_env == agent_env
