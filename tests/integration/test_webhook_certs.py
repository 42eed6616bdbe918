"""Webhook certificates on the real plane: a self-signed certificate and CA that expire
within seconds are renewed while the API server keeps calling the webhook, certificate
files replaced like a Secret volume are served without a restart, and a caBundle that
someone else injected survives the operator's registration and restart. Also the chart's
cert-manager mode, rendered and installed (against stand-in cert-manager CRDs).

Node (name unique to this file, prefix `wcert-`): wcert-a, 1 x 910B3.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, RELEASE, helm, template
from cryptography import x509
from operator_harness import Stack, StackOf

from localplane import LocalPlane, NodeSpec
from localplane.components import OperatorProcess
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.kube import certs
from vnpu_common.wire import names
from vnpu_operator.admission import (
    ServiceRef,
    mutating_webhook_configuration,
    validating_webhook_configuration,
)

# k8s134: also run on the 1.34 lane (`make test-k8s134`), since it depends on the API
# server's or the scheduler's version.
pytestmark = [pytest.mark.plane, pytest.mark.k8s134]

NODE = "wcert-a"
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name=NODE, chips={"910B3": 1})],
    )


def swap_operator(stack: Stack, *extra: str, start: bool = True) -> OperatorProcess:
    """Stops the stack's operator, removes what it registered, and gives the stack a new
    one with `extra` settings (started unless `start` is False)."""
    stack.operator.kill(signal.SIGTERM)
    for kind in KINDS:
        stack.plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)
    name = f"operator-{len(list(stack.workdir.glob('operator-*')))}"
    stack.operator = OperatorProcess(stack.plane, stack.workdir / name, extra=list(extra))
    if start:
        stack.operator.start()
    return stack.operator


def admitted(plane: LocalPlane) -> tuple[bool, str]:
    """Whether the API server, calling both webhooks, admits a vNPU pod (server dry run)."""
    pod = vnpu_pod("wcert-probe", "default", template="vir05_1c_16g")
    r = plane.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    return r.returncode == 0, r.stderr


def wait_admitted(plane: LocalPlane) -> None:
    # The webhook refuses every template until the operator's cache knows the chips.
    wait_for("webhook admits a pod", lambda: admitted(plane)[0], timeout=60, interval=0.5)


def registered_bundle(plane: LocalPlane, kind: str = KINDS[0]) -> bytes | None:
    obj = plane.get_json(kind, names.WEBHOOK_CONFIG_NAME)
    encoded = obj["webhooks"][0]["clientConfig"].get("caBundle")
    return base64.b64decode(encoded) if encoded else None


def served(port: int) -> x509.Certificate:
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    return x509.load_pem_x509_certificate(pem.encode())


def handshake_verified(port: int, bundle: bytes) -> None:
    """A fresh TLS handshake that trusts only `bundle`, as a new API server connection
    would: it fails on an expired certificate or an unknown CA. (The API server keeps its
    connections to the webhook open, so its admissions alone may not show either.)"""
    context = ssl.create_default_context(cadata=bundle.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1"),
    ):
        pass


def test_self_signed_certificate_and_ca_are_renewed_while_the_webhook_answers(
    stack: Stack, plane: LocalPlane
) -> None:
    validity, ca_validity = 10, 30
    operator = swap_operator(
        stack,
        f"--webhook-cert-validity-seconds={validity}",
        f"--webhook-ca-validity-seconds={ca_validity}",
        "--webhook-cert-poll-seconds=0.25",
    )
    wait_admitted(plane)
    seen: dict[int, x509.Certificate] = {}
    failures: list[str] = []
    end = time.monotonic() + ca_validity + 8
    while time.monotonic() < end:
        ok, err = admitted(plane)
        if not ok:
            failures.append(err)
        leaf = served(operator.webhook_port)
        assert leaf.not_valid_after_utc.timestamp() > time.time(), "served an expired leaf"
        seen[leaf.serial_number] = leaf
        bundle = registered_bundle(plane)
        assert bundle is not None
        try:
            handshake_verified(operator.webhook_port, bundle)
        except ssl.SSLError as exc:
            failures.append(f"fresh handshake against the registered bundle: {exc}")
        time.sleep(0.3)
    assert not failures, failures[:5]
    # Renewed at 2/3 of 10 s over 38 s: at least four leaves; the CA (renewed at 20 s)
    # signed some of them with a different key.
    assert len(seen) >= 4, sorted(seen)
    authorities = {
        c.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
        for c in seen.values()
    }
    assert len(authorities) >= 2, authorities
    assert registered_bundle(plane, KINDS[1]) == registered_bundle(plane, KINDS[0])
    assert "serving a new webhook certificate" in operator.log_tail(400)


def write_pair(directory: Path, ca: certs.KeyPair, name: str, *, with_ca: bool) -> certs.KeyPair:
    pair = certs.issue(ca, name, ip_addresses=("127.0.0.1",))
    files = {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem}
    if with_ca:
        files["ca.crt"] = ca.cert_pem
    certs.write_like_a_secret_volume(directory, files)
    return pair


def serial(pair: certs.KeyPair) -> int:
    return int(x509.load_pem_x509_certificate(pair.cert_pem).serial_number)


def test_replaced_certificate_files_are_served_without_a_restart(
    stack: Stack, plane: LocalPlane, tmp_path: Path
) -> None:
    cert_dir = tmp_path / "webhook-certs"
    ca_a, ca_b = certs.make_ca("files-a"), certs.make_ca("files-b")
    first = write_pair(cert_dir, ca_a, "first", with_ca=True)
    operator = swap_operator(
        stack, f"--webhook-cert-dir={cert_dir}", "--webhook-cert-poll-seconds=0.25"
    )
    wait_admitted(plane)
    assert served(operator.webhook_port).serial_number == serial(first)
    assert registered_bundle(plane) == ca_a.cert_pem
    assert operator.proc is not None
    pid = operator.proc.pid

    # A new certificate from a new CA: the bundle must trust it before it is served.
    second = write_pair(cert_dir, ca_b, "second", with_ca=True)
    wait_for(
        "the replaced certificate served",
        lambda: served(operator.webhook_port).serial_number == serial(second),
        timeout=20,
        interval=0.2,
    )
    assert operator.proc is not None
    assert operator.proc.pid == pid
    assert operator.proc.poll() is None
    bundle = registered_bundle(plane)
    assert bundle is not None
    subjects = [c.subject.rfc4514_string() for c in x509.load_pem_x509_certificates(bundle)]
    assert subjects == ["CN=files-b", "CN=files-a"]
    handshake_verified(operator.webhook_port, ca_b.cert_pem)
    ok, err = admitted(plane)
    assert ok, err

    # A half-made update (the new certificate with the old key) is not served.
    third = certs.issue(ca_b, "third", ip_addresses=("127.0.0.1",))
    certs.write_like_a_secret_volume(
        cert_dir, {"tls.crt": third.cert_pem, "tls.key": second.key_pem, "ca.crt": ca_b.cert_pem}
    )
    wait_for(
        "the bad pair reported",
        lambda: "webhook certificate not reloaded" in operator.log_tail(200),
        timeout=20,
    )
    assert served(operator.webhook_port).serial_number == serial(second)
    ok, err = admitted(plane)
    assert ok, err


def injected_configurations(plane: LocalPlane, url: str, ca_pem: bytes) -> None:
    """The configurations as cainjector leaves them: our webhooks with a caBundle the
    operator never saw, and a timeout of 30 s the operator's registration changes to its
    own (so a registration that did nothing cannot pass for one that kept the bundle)."""
    for body in (
        mutating_webhook_configuration(url, ca_pem),
        validating_webhook_configuration(url, ca_pem),
    ):
        body["webhooks"][0]["timeoutSeconds"] = 30
        plane.kubectl("create", "-f", "-", input=json.dumps(body))


def test_registration_and_restart_keep_an_injected_ca_bundle(
    stack: Stack, plane: LocalPlane, tmp_path: Path
) -> None:
    cert_dir = tmp_path / "injected"
    ca = certs.make_ca("injected-ca")
    write_pair(cert_dir, ca, "leaf", with_ca=False)  # cert-manager without a CA in the Secret
    operator = swap_operator(stack, f"--webhook-cert-dir={cert_dir}", start=False)
    url = f"https://127.0.0.1:{operator.webhook_port}"
    injected_configurations(plane, url, ca.cert_pem)
    for restart in range(2):
        operator.start()
        wait_admitted(plane)
        for kind in KINDS:
            obj = plane.get_json(kind, names.WEBHOOK_CONFIG_NAME)
            webhook = obj["webhooks"][0]
            assert webhook["timeoutSeconds"] == 5, (kind, restart)
            assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca.cert_pem, kind
        ok, err = admitted(plane)
        assert ok, err
        operator.kill(signal.SIGTERM)


# --- the chart's cert-manager mode, rendered ----------------------------------------

NAMESPACE = "vnpu-certs"
CERT_MANAGER = ("--set", "webhook.certSource=cert-manager", "--api-versions", "cert-manager.io/v1")


def render(plane: LocalPlane, *args: str) -> list[dict[str, Any]]:
    out = template(plane, *args, namespace=NAMESPACE).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0])


def env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in operator_container(docs)["env"]}


def webhook_config_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    role = one(docs, "ClusterRole", f"{RELEASE}-operator")
    return [r for r in role["rules"] if r["apiGroups"] == ["admissionregistration.k8s.io"]]


def test_cert_manager_mode_renders_certificates_injection_and_no_registration(
    plane: LocalPlane,
) -> None:
    docs = render(plane, *CERT_MANAGER)
    service = f"{RELEASE}-webhook"
    cert = one(docs, "Certificate", service)
    assert cert["metadata"]["namespace"] == NAMESPACE
    assert cert["spec"]["secretName"] == f"{service}-tls"
    assert cert["spec"]["dnsNames"] == [
        f"{service}.{NAMESPACE}", f"{service}.{NAMESPACE}.svc",
        f"{service}.{NAMESPACE}.svc.cluster.local",
    ]  # fmt: skip
    # No issuer given: a self-signed root makes a CA that issues the serving certificate,
    # so renewing the serving certificate leaves the injected CA bundle as it was.
    ca_issuer = one(docs, "Issuer", f"{service}-ca")
    assert cert["spec"]["issuerRef"] == {
        "name": f"{service}-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    ca_cert = one(docs, "Certificate", f"{service}-ca")
    assert ca_cert["spec"]["isCA"] is True
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    assert one(docs, "Issuer", f"{service}-selfsigned")["spec"] == {"selfSigned": {}}

    # The chart owns the configurations; cainjector fills their caBundle.
    target = ServiceRef(namespace=NAMESPACE, name=service, port=443)
    for kind, body in (
        ("MutatingWebhookConfiguration", mutating_webhook_configuration(target, None)),
        ("ValidatingWebhookConfiguration", validating_webhook_configuration(target, None)),
    ):
        shipped = one(docs, kind)
        assert shipped["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"{NAMESPACE}/{service}"
        )
        assert shipped["webhooks"] == body["webhooks"], kind

    # The operator serves the mounted Secret, registers nothing and may not.
    container = operator_container(docs)
    assert "VNPU_WEBHOOK_SERVICE" not in env(docs)
    cert_dir = env(docs)["VNPU_WEBHOOK_CERT_DIR"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == cert_dir]
    assert mount["readOnly"] is True
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == f"{service}-tls"
    assert webhook_config_rules(docs) == []


def test_cert_manager_mode_with_an_issuer_of_the_admins(plane: LocalPlane) -> None:
    docs = render(
        plane, *CERT_MANAGER,
        "--set", "webhook.certManager.issuerRef.name=corp-ca",
        "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer",
    )  # fmt: skip
    assert [d for d in docs if d["kind"] == "Issuer"] == []
    (cert,) = [d for d in docs if d["kind"] == "Certificate"]
    assert cert["spec"]["issuerRef"] == {
        "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"
    }  # fmt: skip


def test_operator_mode_registers_and_renews_and_cert_manager_needs_its_api(
    plane: LocalPlane,
) -> None:
    docs = render(plane, "--set", "webhook.operatorCerts.validityHours=720")
    assert not [d for d in docs if d["kind"] in ("Certificate", "Issuer")]
    e = env(docs)
    assert e["VNPU_WEBHOOK_SERVICE"] == f"{NAMESPACE}/{RELEASE}-webhook:443"
    assert e["VNPU_WEBHOOK_CERT_VALIDITY_SECONDS"] == str(720 * 3600)
    assert "VNPU_WEBHOOK_CERT_DIR" not in e
    # Get and patch of the configurations the chart ships, by name; no create.
    rules = webhook_config_rules(docs)
    verbs = sorted(v for r in rules for v in r["verbs"])
    assert verbs == ["get", "patch"]
    assert all(r["resourceNames"] == [names.WEBHOOK_CONFIG_NAME] for r in rules)
    # Without cert-manager's API in the cluster, an install fails saying so.
    proc = template(
        plane, "--set", "webhook.certSource=cert-manager", namespace=NAMESPACE, check=False
    )
    assert proc.returncode != 0
    assert "cert-manager.io/v1" in proc.stderr


def cert_manager_crd(kind: str, plural: str) -> dict[str, Any]:
    """A stand-in for cert-manager's CRD of `kind`: the API exists, nothing acts on it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True,
                }},
            }],
        },
    }  # fmt: skip


def test_cert_manager_mode_installs_and_leaves_the_operator_no_registration_rights(
    plane: LocalPlane,
) -> None:
    crds = [cert_manager_crd("Certificate", "certificates"), cert_manager_crd("Issuer", "issuers")]
    for crd in crds:
        plane.kubectl("apply", "-f", "-", input=json.dumps(crd))
        plane.kubectl(
            "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s"
        )
    # What this module's operators registered is not Helm's to adopt.
    for kind in KINDS:
        plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)
    installed = helm(
        plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
        "--set", "crds.install=false", "--set", "agent.driver=sim",
        "--set", "webhook.certSource=cert-manager", check=False,
    )  # fmt: skip
    try:
        assert installed.returncode == 0, installed.stderr
        service = f"{RELEASE}-webhook"
        cert = plane.get_json("certificate", service, "-n", NAMESPACE)
        assert cert["spec"]["secretName"] == f"{service}-tls"
        assert plane.get_json("issuer", f"{service}-ca", "-n", NAMESPACE)["spec"]["ca"]
        for kind in KINDS:
            annotations = plane.get_json(kind, names.WEBHOOK_CONFIG_NAME)["metadata"]["annotations"]
            assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{service}"
        account = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-operator"
        for verb, what in (
            ("create", "mutatingwebhookconfigurations"),
            ("create", "validatingwebhookconfigurations"),
            ("patch", f"mutatingwebhookconfigurations/{names.WEBHOOK_CONFIG_NAME}"),
            ("get", f"validatingwebhookconfigurations/{names.WEBHOOK_CONFIG_NAME}"),
        ):
            answer = plane.kubectl("auth", "can-i", verb, what, f"--as={account}", check=False)
            assert answer.stdout.strip() == "no", (verb, what, answer.stdout, answer.stderr)
        # The same account may still do its own work (the impersonation is not refused).
        pods = plane.kubectl("auth", "can-i", "patch", "pods", "-A", f"--as={account}")
        assert pods.stdout.strip() == "yes"
    finally:
        helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s", check=False)
        for crd in crds:
            plane.kubectl("delete", "crd", crd["metadata"]["name"], check=False)
        plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        (("--set", "webhook.certSource=vault"), "/webhook/certSource"),
        (
            ("--set", "webhook.operatorCerts.renewFraction=1.5"),
            "/webhook/operatorCerts/renewFraction",
        ),
        (
            ("--set", "webhook.operatorCerts.validityHours=0"),
            "/webhook/operatorCerts/validityHours",
        ),
        (
            ("--set", "webhook.certManager.issuerRef.kind=Vault"),
            "/webhook/certManager/issuerRef/kind",
        ),
    ],
)
def test_bad_certificate_values_are_refused_naming_the_key(
    plane: LocalPlane, values: tuple[str, ...], needle: str
) -> None:
    proc = template(plane, *values, namespace=NAMESPACE, check=False)
    assert proc.returncode != 0
    assert needle in proc.stderr, proc.stderr
