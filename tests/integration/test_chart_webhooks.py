"""The webhooks of the Helm chart: the configurations it renders are the ones the operator
registers, and its `helm test` hook checks, with a dry-run-only account, that the webhook
answers."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from chart_harness import (
    CHART,
    NAMESPACE,
    RELEASE,
    TEST_SA,
    Credential,
    hook,
    render,
    run_hook_script,
    wait_for,
)
from operator_harness import Stack

from localplane import LocalPlane, NodeSpec
from vnpu_common.wire import names
from vnpu_operator.admission import (
    ServiceRef,
    mutating_webhook_configuration,
    validating_webhook_configuration,
)

pytestmark = pytest.mark.plane


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


def test_the_test_hook_runs_the_script_with_a_dry_run_only_account(plane: LocalPlane) -> None:
    docs = hook(plane, NAMESPACE)
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


def test_the_test_hook_passes_when_the_webhook_refuses_and_fails_when_it_is_gone(
    plane: LocalPlane, namespace: str, tmp_path: Path
) -> None:
    """The hook's own manifests and script, against a running operator's webhook."""
    docs = hook(plane, namespace)
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
        ran = run_hook_script(plane, pod, namespace, cred, tmp_path)
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
        ran = run_hook_script(plane, pod, namespace, cred, tmp_path, VNPU_TEST_TIMEOUT_SECONDS="1")
        assert ran.returncode == 1, ran.stdout + ran.stderr
        assert "FAIL: the vnpu-operator webhook did not answer" in ran.stdout, ran.stdout

        # No webhook configuration at all: the pod is admitted, and the test fails.
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME)
        ran = run_hook_script(plane, pod, namespace, cred, tmp_path, VNPU_TEST_TIMEOUT_SECONDS="1")
        assert ran.returncode == 1, ran.stdout + ran.stderr
        assert "FAIL: a pod naming vnpu.io/template=no-such-template was admitted" in ran.stdout
    finally:
        stack.close()
        for (kind, name), _ in docs.items():
            if kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
                plane.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)
