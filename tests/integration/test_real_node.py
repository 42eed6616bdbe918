"""One real node (kubelet + containerd + runc) on the session plane: it
registers Ready, runs a plain container from a locally imported image, serves
logs and exec through the API server, resolves Downward-API env, lets its pods
reach the API server at the bridge gateway, and terminates pods gracefully.

Needs root; without it the fixture fails with RealNodeError saying so. Marker
`realnode`: `make test-realnode` (part of `make test`) runs these.
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
from realnode_harness import (
    check_devices,
    exec_in,
    running,
    serving_vnpus,
    vnpu_busybox_pod,
)

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
from vnpu_common.kube import certs
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.realnode]


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
    pod = running(plane, namespace, name)
    print(f"[realnode] pod create -> Running: {time.monotonic() - t0:.2f}s")

    logs = wait_for(
        "the container's first line in kubectl logs",
        lambda: plane.kubectl("logs", "-n", namespace, name, check=False).stdout,
        20,
    )
    assert logs.strip() == f"hello from {name}"
    env = dict(
        line.split("=", 1)
        for line in exec_in(plane, namespace, name, "env").splitlines()
        if "=" in line
    )
    assert env["POD_NAME"] == name
    assert env["NODE_NAME"] == real_node.name
    assert env["NOTE"] == f"note-of-{name}"
    assert env["POD_IP"] == pod["status"]["podIP"]
    assert env["POD_IP"].startswith("10.88.0.")
    dev = exec_in(plane, namespace, name, "ls", "/dev").split()
    assert {"null", "zero", "urandom"} <= set(dev)
    assert not [d for d in dev if d.startswith("davinci")]


def test_pod_reaches_the_api_server_at_the_gateway(
    plane: LocalPlane, real_node: RealNode, namespace: str
) -> None:
    name = f"client-{uuid.uuid4().hex[:6]}"
    manifest = _pod(name, real_node, SERVE)
    manifest["metadata"]["namespace"] = namespace
    plane.apply(manifest)
    running(plane, namespace, name)
    port = plane.ports.apiserver
    # From inside the pod network: the API server's port answers at the gateway. In
    # plain HTTP, since busybox's own TLS (no openssl in the image) offers only SHA-1
    # signatures, which servers built with Go >= 1.25, kube-apiserver 1.37 among them,
    # refuse (RFC 9155); the product's Python clients in pods are test_real_node_chart's.
    # Go's HTTPS server answers plain HTTP with a 400 of its own.
    out = exec_in(
        plane, namespace, name, "sh", "-c",
        f"printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {POD_GATEWAY} {port}",
    )  # fmt: skip
    assert "Client sent an HTTP request to an HTTPS server" in out, out
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
    pod = running(plane, namespace, name)
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


# -- stage D: the Ascend runtime stand-in, with the operator and an agent ----


@pytest.fixture(scope="module")
def vnpu_stack(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    with serving_vnpus(plane, real_node, Path(tmp_path_factory.mktemp("vnpu-stack"))):
        yield real_node


def test_vnpu_pods_see_exactly_their_devices_and_keep_them_across_a_restart(
    plane: LocalPlane, vnpu_stack: RealNode, namespace: str
) -> None:
    node = vnpu_stack
    t0 = time.monotonic()
    plane.apply(vnpu_busybox_pod("two", namespace, 2))
    pod = running(plane, namespace, "two")
    print(f"[realnode] vNPU pod create -> Running: {time.monotonic() - t0:.2f}s")
    assert pod["spec"]["runtimeClassName"] == "ascend"
    assert pod["spec"]["nodeName"] == node.name
    ids = check_devices(plane, namespace, pod)
    assert len(ids) == 2
    assert {p.name for p in node.device_dir.glob("vdavinci*")} == {f"vdavinci{i}" for i in ids}

    plane.apply(vnpu_busybox_pod("one", namespace, 1))
    other = check_devices(plane, namespace, running(plane, namespace, "one"))
    assert len(other) == 1
    assert not set(other) & set(ids)

    # A killed container is restarted by the kubelet with the same devices.
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("//")[-1]
    node.ctr("tasks", "kill", "-s", "SIGKILL", cid)

    def restarted() -> dict[str, Any] | None:
        p = plane.get_json("pod", "two", "-n", namespace)
        status = (p["status"].get("containerStatuses") or [{}])[0]
        if status.get("restartCount", 0) >= 1 and "running" in status.get("state", {}):
            return dict(p)
        return None

    again = wait_for("the killed container restarted", restarted, 60, interval=0.2)
    assert again["status"]["containerStatuses"][0]["containerID"].split("//")[-1] != cid
    assert check_devices(plane, namespace, again) == ids


def test_a_vnpu_its_container_never_touches_is_kept(
    plane: LocalPlane, vnpu_stack: RealNode, namespace: str
) -> None:
    """The seed scenario with a real container: the container sleeps and never
    opens its device, so the driver reads the vNPU as not in use, and an
    idle-guessing cleanup would take it. The agent here collects undeclared idle
    vNPUs after 2 s (--gc-grace-seconds, 120 in production) and resyncs every
    0.5 s (30): 12 s idle are six grace periods and two dozen resyncs, the
    compressed form of minutes in production."""
    node = vnpu_stack
    plane.apply(vnpu_busybox_pod("idle", namespace, 1))
    pod = running(plane, namespace, "idle")
    ids = check_devices(plane, namespace, pod)
    device = node.device_dir / f"vdavinci{ids[0]}"
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        assert device.exists(), "the idle pod's vNPU was destroyed"
        time.sleep(0.5)
    after = plane.get_json("pod", "idle", "-n", namespace)
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert check_devices(plane, namespace, after) == ids
    allocs = plane.get_json("vnpuallocations", "-n", namespace,
                            "-l", f"{names.LABEL_POD_UID}={pod['metadata']['uid']}")  # fmt: skip
    assert [a["status"]["phase"] for a in allocs["items"]] == [names.PHASE_READY]


def _delete_and_watch(
    plane: LocalPlane, node: RealNode, namespace: str, name: str
) -> tuple[float, float, bool]:
    """Deletes a running one-vNPU pod; returns when its device node went and
    when the pod object went (s after the delete), and whether the pod's
    container still ran when the device went."""
    pod = running(plane, namespace, name)
    ids = check_devices(plane, namespace, pod)
    device = node.device_dir / f"vdavinci{ids[0]}"
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("//")[-1]
    assert device.exists()
    plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
    t0 = time.monotonic()
    device_gone = pod_gone = None
    running_at_destroy = False
    while time.monotonic() - t0 < 60 and (device_gone is None or pod_gone is None):
        if device_gone is None and not device.exists():
            device_gone = time.monotonic() - t0
            running_at_destroy = cid in node.ctr("tasks", "ls", "-q").stdout.split()
        if pod_gone is None and plane.get_json("pod", name, "-n", namespace) is None:
            pod_gone = time.monotonic() - t0
        time.sleep(0.05)
    print(f"[realnode] delete: vNPU destroyed at {device_gone}s, pod gone at {pod_gone}s")
    assert device_gone is not None, "the vNPU's device node was never removed"
    assert pod_gone is not None, "the pod object never went"
    return device_gone, pod_gone, running_at_destroy


def test_delete_destroys_the_vnpu_before_the_pod_object_goes(
    plane: LocalPlane, vnpu_stack: RealNode, namespace: str
) -> None:
    plane.apply(vnpu_busybox_pod("doomed", namespace, 1))
    device_gone, pod_gone, _ = _delete_and_watch(plane, vnpu_stack, namespace, "doomed")
    assert device_gone <= pod_gone
    # The kubelet's grace period ran (2 s: sleep as PID 1 ignores SIGTERM).
    assert pod_gone >= 1.5


def test_the_vnpu_outlives_the_containers_grace_period(
    plane: LocalPlane, vnpu_stack: RealNode, namespace: str
) -> None:
    plane.apply(vnpu_busybox_pod("graceful", namespace, 1))
    _, _, running_at_destroy = _delete_and_watch(plane, vnpu_stack, namespace, "graceful")
    assert not running_at_destroy, "the vNPU was destroyed while its container still ran"


def test_a_pod_never_ungated_never_starts_a_container(
    plane: LocalPlane, vnpu_stack: RealNode, namespace: str
) -> None:
    plane.apply(vnpu_busybox_pod("nowhere", namespace, 1, nodeSelector={"example.com/none": "x"}))
    time.sleep(5)
    pod = plane.get_json("pod", "nowhere", "-n", namespace)
    assert pod["spec"].get("schedulingGates")
    assert not pod["spec"].get("nodeName")
    assert not pod["status"].get("containerStatuses")
    assert pod["metadata"]["uid"] not in vnpu_stack.ctr("containers", "ls").stdout


def test_an_unknown_vnpu_id_fails_the_create_with_the_reason_in_the_status(
    plane: LocalPlane, real_node: RealNode, namespace: str
) -> None:
    """Not a vNPU pod (the webhook leaves it alone): it names the runtime
    class and a vNPU this host does not have, as a stale or forged value would."""
    name = f"unknown-{uuid.uuid4().hex[:6]}"
    manifest = _pod(name, real_node, SERVE, runtimeClassName="ascend")
    manifest["metadata"]["namespace"] = namespace
    manifest["spec"]["containers"][0]["env"] += [
        {"name": names.ENV_VISIBLE_DEVICES, "value": "1100"},
        {"name": names.ENV_RUNTIME_OPTIONS, "value": names.RUNTIME_OPTIONS_VIRTUAL},
    ]
    plane.apply(manifest)

    def refused() -> str | None:
        pod = plane.get_json("pod", name, "-n", namespace)
        text = json.dumps((pod or {}).get("status", {}).get("containerStatuses", []))
        return text if "vNPU 1100, but its device" in text else None

    status = wait_for("the create refused with the runtime's reason", refused, 60, interval=0.5)
    assert "does not exist on this host" in status
    print(f"[realnode] refused container status: {status}")
    pod = plane.get_json("pod", name, "-n", namespace)
    container = pod["status"]["containerStatuses"][0]
    assert "running" not in container["state"]
    assert container["ready"] is False


def test_stop_cleans_the_host_and_a_second_start_works(
    plane: LocalPlane, real_node: RealNode, namespace: str
) -> None:
    manifest = _pod(f"left-{uuid.uuid4().hex[:6]}", real_node, SERVE)
    manifest["metadata"]["namespace"] = namespace
    plane.apply(manifest)
    running(plane, namespace, manifest["metadata"]["name"])

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
    running(plane, namespace, name)
