"""Runs the plane's helm binary with its state kept inside the plane's workdir,
and renders the project's chart with it; what the test_chart_* modules share: the
release's namespace and accounts, bearer-token credentials, the test hook's script."""

from __future__ import annotations

import functools
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localplane import LocalPlane
from localplane.chart import CHART, RELEASE
from localplane.chart import adopt_crds as _adopt_crds
from localplane.chart import helm as _helm
from localplane.waiting import wait_for as shared_wait_for

__all__ = [
    "AGENT_SA",
    "CHART",
    "NAMESPACE",
    "NODE_A",
    "NODE_B",
    "OPERATOR_SA",
    "RELEASE",
    "SIM_VALUES",
    "TEST_SA",
    "Credential",
    "adopt_crds",
    "agent_pod",
    "get_json",
    "helm",
    "hook",
    "render",
    "run_hook_script",
    "template",
    "token",
    "wait_for",
]

KUBE_VERSION = "1.34.0"


def helm(plane: LocalPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = _helm(plane, *args)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
    return proc


def template(
    plane: LocalPlane, *args: str, namespace: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as release RELEASE for KUBE_VERSION."""
    where = ("-n", namespace) if namespace else ()
    return helm(
        plane, "template", RELEASE, str(CHART), *where, "--kube-version", KUBE_VERSION, *args,
        check=check,
    )  # fmt: skip


def adopt_crds(plane: LocalPlane, namespace: str) -> None:
    """Hands the plane's CRDs over to release RELEASE in `namespace`."""
    _adopt_crds(plane, namespace, RELEASE)


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


def hook(plane: LocalPlane, namespace: str, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    docs = render(
        plane, "--show-only", "templates/tests/webhook-test.yaml", *values, namespace=namespace
    )
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


TEST_SA = f"{RELEASE}-test"


def run_hook_script(
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
