"""Runs `vnpu-operator` as a real process against the local plane, with its
webhooks registered on a loopback URL, and helpers for pods that ask for vNPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from agent_harness import AGENT_NAMESPACE, wait_for

from localplane import LocalPlane
from localplane.plane import free_port
from vnpu_operator import names

ROOT = Path(__file__).resolve().parents[2]


class OperatorProcess:
    def __init__(self, plane: LocalPlane, workdir: Path, *, extra: list[str] | None = None) -> None:
        self.plane = plane
        self.workdir = workdir
        self.extra = extra or []
        self.port = free_port()
        self.webhook_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "operator.log"

    def start(self, *, wait_ready: bool = True) -> OperatorProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        args = [
            sys.executable, "-m", "vnpu_operator.main",
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--agent-namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.port}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-url=https://127.0.0.1:{self.webhook_port}",
            "--retry-max-seconds=2",
            "--log-level=DEBUG",
            *self.extra,
        ]  # fmt: skip
        env = {**os.environ, **self.plane.env()}
        env["PYTHONPATH"] = os.pathsep.join(str(ROOT / p) for p in ("operator", "node_agent"))
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        if wait_ready:
            wait_for("operator ready", self.ready, timeout=60)
        return self

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def vnpu_pod(
    name: str,
    template: str = "vir05_1c_16g",
    *,
    count: int | None = None,
    chip_model: str | None = None,
    containers: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    init_containers: list[str] | None = None,
) -> dict[str, Any]:
    """A pod manifest asking for vNPUs through annotations."""
    ann = {names.ANN_TEMPLATE: template, **(annotations or {})}
    if count is not None:
        ann[names.ANN_COUNT] = str(count)
    if chip_model is not None:
        ann[names.ANN_CHIP_MODEL] = chip_model
    spec: dict[str, Any] = {
        "containers": [{"name": c, "image": "busybox"} for c in (containers or ["main"])],
    }
    if init_containers:
        spec["initContainers"] = [{"name": c, "image": "busybox"} for c in init_containers]
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": ann},
        "spec": spec,
    }


def get_json(plane: LocalPlane, *args: str) -> Any:
    out = plane.kubectl("get", *args, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def pod_allocations(plane: LocalPlane, namespace: str, uid: str) -> list[dict[str, Any]]:
    items = get_json(
        plane, "vnpuallocations", "-n", namespace, "-l", f"{names.LABEL_POD_UID}={uid}"
    )
    return list((items or {}).get("items", []))
