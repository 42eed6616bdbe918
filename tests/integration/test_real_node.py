"""One real node (kubelet + containerd + runc) on the session plane: it
registers Ready, runs a plain container from a locally imported image, serves
logs and exec through the API server, resolves Downward-API env, lets its pods
reach the API server at the bridge gateway, and terminates pods gracefully.

Needs root; without it the fixture fails with RealNodeError saying so. Not
part of `make test` yet: `make test-realnode` runs these (marker `realnode`).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from localplane.plane import LocalPlane, free_port
from localplane.realnode import (
    BRIDGE,
    CONTAINERD_RUN,
    KUBELET_ROOT,
    POD_GATEWAY,
    REAL_NODE_LABEL,
    TEST_IMAGE,
    RealNode,
    RealNodeError,
    _mount_points,
    primary_ip,
)
from localplane.waiting import wait_for
from vnpu_common import certs

pytestmark = [pytest.mark.plane, pytest.mark.realnode]


@pytest.fixture(scope="module")
def real_node(plane: LocalPlane) -> Iterator[RealNode]:
    node = RealNode(plane)
    node.start(progress=lambda msg: print(f"[realnode] {msg}"))
    print(f"[realnode] timings: {node.timings}")
    yield node
    node.stop()
    print(f"[realnode] stopped in {node.timings['node_stop']:.1f}s")


def _pod(name: str, node: RealNode, script: str, **spec: Any) -> dict[str, Any]:
    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"example.com/note": f"note-of-{name}"}},
        "spec": {
            "nodeName": node.name,
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "env": [
                        {"name": "POD_NAME", **field("metadata.name")},
                        {"name": "NODE_NAME", **field("spec.nodeName")},
                        {"name": "POD_IP", **field("status.podIP")},
                        {"name": "NOTE", **field("metadata.annotations['example.com/note']")},
                    ],
                }
            ],
            **spec,
        },
    }


# PID 1 ignores SIGTERM unless it traps it.
SERVE = 'trap "exit 0" TERM; echo "hello from $POD_NAME"; while true; do sleep 1; done'


def _running(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = plane.get_json("pod", name, "-n", namespace)
        if pod and pod["status"].get("phase") == "Running":
            return dict(pod)
        return None

    result: dict[str, Any] = wait_for(f"pod {name} Running", check, 60, interval=0.1)
    return result


def _exec(plane: LocalPlane, namespace: str, name: str, *cmd: str) -> str:
    return plane.kubectl("exec", "-n", namespace, name, "--", *cmd).stdout


def test_node_registers_ready_under_the_hostname(plane: LocalPlane, real_node: RealNode) -> None:
    node = plane.get_json("node", socket.gethostname().lower())
    assert node is not None
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert node["metadata"]["labels"][REAL_NODE_LABEL] == "true"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == primary_ip()
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    # kwok leaves it alone: it manages only nodes annotated for it.
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})


def test_pod_runs_with_logs_exec_and_downward_env(
    plane: LocalPlane, real_node: RealNode, namespace: str
) -> None:
    name = f"plain-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    manifest = _pod(name, real_node, SERVE)
    manifest["metadata"]["namespace"] = namespace
    plane.apply(manifest)
    pod = _running(plane, namespace, name)
    print(f"[realnode] pod create -> Running: {time.monotonic() - t0:.2f}s")

    logs = wait_for(
        "the container's first line in kubectl logs",
        lambda: plane.kubectl("logs", "-n", namespace, name, check=False).stdout,
        20,
    )
    assert logs.strip() == f"hello from {name}"
    env = dict(
        line.split("=", 1)
        for line in _exec(plane, namespace, name, "env").splitlines()
        if "=" in line
    )
    assert env["POD_NAME"] == name
    assert env["NODE_NAME"] == real_node.name
    assert env["NOTE"] == f"note-of-{name}"
    assert env["POD_IP"] == pod["status"]["podIP"]
    assert env["POD_IP"].startswith("10.88.0.")
    dev = _exec(plane, namespace, name, "ls", "/dev").split()
    assert {"null", "zero", "urandom"} <= set(dev)
    assert not [d for d in dev if d.startswith("davinci")]


def test_pod_reaches_the_api_server_at_the_gateway(
    plane: LocalPlane, real_node: RealNode, namespace: str
) -> None:
    name = f"client-{uuid.uuid4().hex[:6]}"
    manifest = _pod(name, real_node, SERVE)
    manifest["metadata"]["namespace"] = namespace
    plane.apply(manifest)
    _running(plane, namespace, name)
    port = plane.ports.apiserver
    # From inside the pod network: the API server answers at the gateway
    # (busybox's wget does not verify certificates; anonymous /readyz is public).
    out = _exec(
        plane, namespace, name, "wget", "-q", "-O-", "--no-check-certificate",
        f"https://{POD_GATEWAY}:{port}/readyz",
    )  # fmt: skip
    assert out.strip() == "ok"
    # And its certificate names the gateway, so a verifying client (the pod's
    # service-account CA is the plane's) accepts it there.
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    with (
        socket.create_connection((POD_GATEWAY, port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=POD_GATEWAY) as tls,
    ):
        assert tls.version() is not None


class _Refuser(BaseHTTPRequestHandler):
    """An admission webhook that refuses every request, naming itself."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": False,
                    "status": {"message": "refused by the webhook behind the Service"},
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_webhook_behind_a_service_is_called_at_its_endpoint(
    plane: LocalPlane, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    """No kube-proxy routes ClusterIPs: the API server must call a webhook's
    Service at its endpoint's address (--enable-aggregator-routing)."""
    service = "refuser"
    pair = certs.issue(plane.ca(), service, dns_names=(f"{service}.{namespace}.svc",))
    pair.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    port = free_port()
    server = ThreadingHTTPServer((real_node.node_ip, port), _Refuser)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    webhook = f"refuser-{namespace}"
    try:
        for manifest in (
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": service, "namespace": namespace},
             "spec": {"ports": [{"port": 443, "targetPort": port}]}},
            {"apiVersion": "v1", "kind": "Endpoints",
             "metadata": {"name": service, "namespace": namespace},
             "subsets": [{"addresses": [{"ip": real_node.node_ip}],
                          "ports": [{"port": port}]}]},
            {"apiVersion": "admissionregistration.k8s.io/v1",
             "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": webhook},
             "webhooks": [{
                 "name": "refuser.localplane.vnpu.io",
                 "clientConfig": {
                     "service": {"namespace": namespace, "name": service, "port": 443},
                     "caBundle": base64.b64encode(plane.ca_file.read_bytes()).decode(),
                 },
                 "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                            "apiVersions": ["v1"], "resources": ["configmaps"]}],
                 "namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "failurePolicy": "Fail",
                 "sideEffects": "None",
                 "admissionReviewVersions": ["v1"],
                 "timeoutSeconds": 5,
             }]},
        ):  # fmt: skip
            plane.apply(manifest)

        def refused() -> str:
            out = plane.kubectl(
                "create", "configmap", f"probe-{uuid.uuid4().hex[:6]}", "-n", namespace,
                check=False,
            )  # fmt: skip
            return out.stderr if out.returncode != 0 else ""

        # The webhook configuration takes effect a moment after the write.
        message = wait_for("the webhook to be called", refused, 30, interval=0.5)
        assert "refused by the webhook behind the Service" in message
    finally:
        plane.kubectl("delete", "validatingwebhookconfiguration", webhook, check=False)
        server.shutdown()


def test_graceful_delete_honours_a_short_grace_period(
    plane: LocalPlane, real_node: RealNode, namespace: str
) -> None:
    name = f"stubborn-{uuid.uuid4().hex[:6]}"
    # `sleep` as PID 1 ignores SIGTERM: the kubelet must wait out the grace
    # period, then kill.
    manifest = _pod(name, real_node, "exec sleep 3600", terminationGracePeriodSeconds=2)
    manifest["metadata"]["namespace"] = namespace
    plane.apply(manifest)
    pod = _running(plane, namespace, name)
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("//")[-1]
    assert container_id in real_node.ctr("tasks", "ls", "-q").stdout.split()

    t0 = time.monotonic()
    plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=true", timeout=60)
    took = time.monotonic() - t0
    print(f"[realnode] delete with grace 2s: {took:.2f}s")
    assert 1.5 <= took < 20
    assert container_id not in real_node.ctr("tasks", "ls", "-q").stdout.split()


def test_a_second_real_node_is_refused(plane: LocalPlane, real_node: RealNode) -> None:
    with pytest.raises(RealNodeError, match="a real node already runs on this machine"):
        RealNode(plane, plane.workdir / "second-realnode").start()
    # The refused one touched nothing: the first still serves.
    node = plane.get_json("node", real_node.name)
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"


def test_stop_cleans_the_host_and_a_second_start_works(
    plane: LocalPlane, real_node: RealNode, namespace: str
) -> None:
    manifest = _pod(f"left-{uuid.uuid4().hex[:6]}", real_node, SERVE)
    manifest["metadata"]["namespace"] = namespace
    plane.apply(manifest)
    _running(plane, namespace, manifest["metadata"]["name"])

    real_node.stop()
    roots = (str(KUBELET_ROOT), str(CONTAINERD_RUN), str(real_node.workdir))
    assert not [m for m in _mount_points() if m.startswith(roots)]
    assert not KUBELET_ROOT.exists()
    assert not CONTAINERD_RUN.exists()
    assert not Path(f"/sys/class/net/{BRIDGE}").exists()
    assert plane.get_json("node", real_node.name) is None
    wait_for(
        "the pod bound to the stopped node gone",
        lambda: plane.get_json("pod", manifest["metadata"]["name"], "-n", namespace) is None,
        30,
    )

    real_node.start()
    name = f"again-{uuid.uuid4().hex[:6]}"
    again = _pod(name, real_node, SERVE)
    again["metadata"]["namespace"] = namespace
    plane.apply(again)
    _running(plane, namespace, name)
