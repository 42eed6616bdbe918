"""The Helm chart installed on a real kube-apiserver: install, RBAC of each component, the
agents' node scoping (ValidatingAdmissionPolicy), `helm test`, upgrade and uninstall.

The tests of this module share one release and run in file order: install first,
uninstall last.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_harness import (
    AGENT_SA,
    CHART,
    NAMESPACE,
    NODE_A,
    NODE_B,
    OPERATOR_SA,
    RELEASE,
    SIM_VALUES,
    TEST_SA,
    Credential,
    adopt_crds,
    agent_pod,
    get_json,
    helm,
    run_hook_script,
    token,
    wait_for,
)

from localplane import LocalPlane, NodeSpec
from vnpu_common.wire import names
from vnpu_common.wire.patches import JSON_PATCH, MERGE

pytestmark = pytest.mark.plane


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
    # Left over by a failed test: no hook (kwok would run none, or the last test held it).
    helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks", check=False)
    plane.install_policies()


def test_install_creates_the_objects(plane: LocalPlane, release: str) -> None:
    deploy = get_json(plane, "deployment", f"{release}-operator", "-n", NAMESPACE)
    spec = deploy["spec"]
    # Two replicas, one leading (docs/HELM.md, "High availability"); a rollout starts a
    # new one before it stops an old one.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]["spec"]
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    (constraint,) = pod["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "kubernetes.io/hostname"
    assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
    pdb = get_json(plane, "poddisruptionbudget", f"{release}-operator", "-n", NAMESPACE)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    # The leader Lease names its holder by the pod's name.
    assert env["VNPU_LEADER_ELECTION_IDENTITY"]["valueFrom"]["fieldRef"] == {
        "apiVersion": "v1",
        "fieldPath": "metadata.name",
    }
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] == 5
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
    ("get", f"mutatingwebhookconfigurations.{ADMREG}/{names.WEBHOOK_CONFIG_NAME}"),
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
    # Agent Leases are listed and watched in the release namespace only.
    ("list", "leases.coordination.k8s.io"),
    ("watch", "leases.coordination.k8s.io"),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io/other"),
    ("delete", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
    # The chart ships both configurations: the operator only writes their CA bundle,
    # and could not create one by another name (a create is not limited by name).
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
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
    # Agent liveness: the agents' Leases are watched, in the release namespace only.
    assert cred.can_i("list", leases, NAMESPACE)
    assert cred.can_i("watch", leases, NAMESPACE)
    assert not cred.can_i("watch", leases, "default")
    assert not cred.can_i("patch", leases, NAMESPACE)
    # Leader election: its own Lease only (create cannot be limited by name).
    assert cred.can_i("create", leases, NAMESPACE)
    leader = f"{leases}/{names.LEADER_LEASE_NAME}"
    assert cred.can_i("get", leader, NAMESPACE)
    assert cred.can_i("update", leader, NAMESPACE)
    # Renewals and the hand-back are JSON patches testing the holder.
    assert cred.can_i("patch", leader, NAMESPACE)
    assert not cred.can_i("update", f"{leases}/{names.lease_name(NODE_A)}", NAMESPACE)
    assert not cred.can_i("patch", f"{leases}/{names.lease_name(NODE_A)}", NAMESPACE)
    assert not cred.can_i("delete", leader, NAMESPACE)
    assert not cred.can_i("create", leases, "default")


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
    """The quota's scope matches the critical classes of the release's pods (the agents'
    system-node-critical, the operator's system-cluster-critical): the quota controller
    counts exactly those pods, which is what admits them where the classes are limited."""
    quota = f"{release}-critical-pods"

    def counted() -> int | None:
        pods = [
            p
            for component in ("agent", "operator")
            for p in get_json(
                plane, "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}"
            )["items"]
        ]
        used = plane.quota_used(NAMESPACE, quota).get("pods")
        return len(pods) if pods and used == str(len(pods)) else None

    # Two agents and two operator replicas.
    assert wait_for("the quota to count the agent and operator pods", counted) >= 4


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
        ran = run_hook_script(plane, pod, NAMESPACE, cred, tmp_path, VNPU_TEST_TIMEOUT_SECONDS="1")
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


PRE_DELETE = f"{RELEASE}-pre-delete"
VNPU_RESOURCES = (names.RES_AICORE, names.RES_MEMORY_MB, names.RES_VNPUS)


def _uninstall_running_the_hook(
    plane: LocalPlane, workdir: Path
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """`helm uninstall` with its pre-delete hook run by this test: kwok completes a Job's
    pods without running them, so the release's pods are kept off the kwok nodes (see the
    caller) and this test is the kubelet of the hook's pod, as for `helm test`: it runs the
    pod's command as its ServiceAccount and writes the pod's phase from the exit code; the
    Job controller and Helm do the rest. (helm's outcome, the script's)"""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            helm, plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s",
            check=False,
        )  # fmt: skip

        def hook_pod() -> dict[str, Any] | None:
            pods = get_json(plane, "pods", "-n", NAMESPACE, "-l", f"job-name={PRE_DELETE}")
            waiting = [p for p in pods["items"] if p["status"].get("phase") == "Pending"]
            return (
                waiting[0]
                if waiting and not waiting[0]["metadata"].get("deletionTimestamp")
                else None
            )

        pod = wait_for("the pre-delete hook's pod", hook_pod)
        name = pod["metadata"]["name"]
        cred = plane.kubectl(
            "create", "token", PRE_DELETE, "-n", NAMESPACE, "--bound-object-kind=Pod",
            f"--bound-object-name={name}",
        ).stdout.strip()  # fmt: skip
        workdir.mkdir(exist_ok=True)
        ran = run_hook_script(plane, pod, NAMESPACE, cred, workdir,
                              VNPU_SA_DIR=str(workdir / "serviceaccount"),
                              VNPU_RELEASE_NAMESPACE=NAMESPACE)  # fmt: skip
        phase = "Succeeded" if ran.returncode == 0 else "Failed"
        terminated = {"exitCode": ran.returncode,
                      "reason": "Completed" if ran.returncode == 0 else "Error"}  # fmt: skip
        status = {"status": {"phase": phase, "containerStatuses": [{
            "name": "pre-delete", "image": pod["spec"]["containers"][0]["image"],
            "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": terminated},
        }]}}  # fmt: skip
        plane.kubectl("patch", "pod", name, "-n", NAMESPACE, "--subresource=status",
                      "--type=merge", "-p", json.dumps(status))  # fmt: skip
        return running.result(timeout=180), ran


def test_uninstall_refuses_while_allocations_exist_then_clears_the_nodes(
    plane: LocalPlane, release: str, tmp_path: Path
) -> None:
    # The hook counts every VNPUAllocation of the cluster: earlier modules on this
    # shared plane may have left some whose agents are gone. Cleared first, as
    # docs/HELM.md (Uninstall) says, so the refusal below is about this test's
    # allocation alone. Their pods go too: this release's operator runs, and would
    # place a pod left waiting again.
    left_over: list[str] = []

    def none_left() -> bool:
        items = (get_json(plane, names.ALLOCATION_PLURAL, "-A") or {}).get("items", [])
        left_over[:] = [_describe(item) for item in items]
        for left in items:
            namespace = left["metadata"]["namespace"]
            if plane.kubectl("get", "namespace", namespace, check=False).returncode != 0:
                # It outlived its namespace (an API server restart of an earlier module
                # hid the CRDs from the namespace controller): writes need it back.
                plane.kubectl("create", "namespace", namespace, check=False)
            where = ["-n", namespace, names.ALLOCATION_PLURAL, left["metadata"]["name"]]
            pod = ["-n", namespace, "pod", left["spec"]["podName"]]
            for obj in (pod, where):
                for verb in (["patch", *obj, "--type=merge", "-p",
                              '{"metadata":{"finalizers":null}}'],
                             ["delete", *obj, "--wait=false"]):  # fmt: skip
                    done = plane.kubectl(*verb, check=False)
                    if done.returncode != 0 and "NotFound" not in done.stderr:
                        left_over.append(f"{verb[0]} {obj[-1]}: {done.stderr.strip()}")
        return not items

    try:
        wait_for("no VNPUAllocation left", none_left, timeout=90, interval=1)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; still there: {left_over}") from None
    # The release's pods where no kwok node is (kwok would complete the hook's Job itself).
    helm(plane, "upgrade", release, str(CHART), "-n", NAMESPACE, "--reuse-values",
         "--set-string", "operator.nodeSelector.vnpu-test/no-such-node=true")  # fmt: skip
    deploy = get_json(plane, "deployment", f"{release}-operator", "-n", NAMESPACE)
    replicas = deploy["spec"]["replicas"]
    base = f"/apis/{names.API_VERSION}/namespaces/{NAMESPACE}/{names.ALLOCATION_PLURAL}"
    status, body = token(plane, OPERATOR_SA).request("POST", base, _allocation(NAMESPACE, NODE_A))
    assert status == 201, body
    # What the operator advertises (no operator runs here).
    advertised = {r: "16" for r in VNPU_RESOURCES}
    both = {"status": {"capacity": advertised, "allocatable": advertised}}
    plane.kubectl("patch", "node", NODE_A, "--subresource=status", "--type=merge", "-p",
                  json.dumps(both))  # fmt: skip

    outcome, ran = _uninstall_running_the_hook(plane, tmp_path / "refused")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert (
        f"REFUSED: 1 VNPUAllocation(s) exist: {NAMESPACE}/alloc-{NODE_A} (pod p)." in ran.stdout
    ), ran.stdout
    assert "--set uninstall.force=true" in ran.stdout
    assert outcome.returncode != 0, outcome.stdout
    assert "pre-delete" in outcome.stderr, outcome.stderr
    # Nothing was deleted or stopped.
    after = get_json(plane, "deployment", f"{release}-operator", "-n", NAMESPACE)["spec"]
    assert after["replicas"] == replicas
    get_json(plane, names.ALLOCATION_PLURAL, f"alloc-{NODE_A}", "-n", NAMESPACE)

    plane.kubectl("patch", names.ALLOCATION_PLURAL, f"alloc-{NODE_A}", "-n", NAMESPACE,
                  "--type=merge", "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
    plane.kubectl("delete", names.ALLOCATION_PLURAL, f"alloc-{NODE_A}", "-n", NAMESPACE)
    outcome, ran = _uninstall_running_the_hook(plane, tmp_path / "done")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"operator {NAMESPACE}/{release}-operator scaled to 0" in ran.stdout, ran.stdout
    assert "vNPU resources removed from " in ran.stdout, ran.stdout
    assert NODE_A in ran.stdout, ran.stdout
    assert outcome.returncode == 0, outcome.stderr
    node = get_json(plane, "node", NODE_A)["status"]
    for section in ("capacity", "allocatable"):
        assert not set(VNPU_RESOURCES) & set(node[section]), node[section]
    # The hook's account and RBAC went with it.
    left = plane.kubectl("get", "sa,role,rolebinding", "-n", NAMESPACE, "-o", "name").stdout
    assert PRE_DELETE not in left, left
    for kind in ("clusterrole", "clusterrolebinding"):
        assert plane.kubectl("get", kind, PRE_DELETE, check=False).returncode != 0


def _describe(item: dict[str, Any]) -> str:
    """One allocation as a failure message needs it: who owns it and what holds it."""
    meta = item["metadata"]
    owners = [f"{o['kind']}/{o['name']}" for o in meta.get("ownerReferences", [])]
    return (
        f"{meta['namespace']}/{meta['name']} pod={item['spec'].get('podName')} "
        f"node={item['spec'].get('nodeName')} owners={owners} "
        f"finalizers={meta.get('finalizers')} deleting={meta.get('deletionTimestamp')} "
        f"created={meta.get('creationTimestamp')} phase={item.get('status', {}).get('phase')}"
    )


def test_uninstall_leaves_nothing_but_the_crds(plane: LocalPlane, release: str) -> None:
    # Uninstalled by the test above.
    assert helm(plane, "status", release, "-n", NAMESPACE, check=False).returncode != 0
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
