"""Runs `vnpu-agent` as a real process against the local plane, and creates
allocations the way the operator does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from localplane import LocalPlane
from localplane.plane import free_port
from localplane.waiting import wait_for
from vnpu_agent.drivers.sim import SimDriver
from vnpu_operator import names

AGENT_NAMESPACE = "vnpu-system"


REPO = Path(__file__).resolve().parents[2]


class ServiceProcess:
    """One of our commands running against the plane: its log file, its
    /readyz and /metrics, and signals. Subclasses build the command line."""

    what = "process"
    kill_timeout = 20.0
    tail_lines = 40

    def __init__(self, plane: LocalPlane, workdir: Path, log_name: str) -> None:
        self.plane = plane
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / log_name

    def launch(self, args: list[str], env: dict[str, str], *, ready_timeout: float) -> None:
        """Starts `args` with our source roots on PYTHONPATH, output to the
        log; waits for /readyz unless `ready_timeout` is 0."""
        env = {
            **env,
            "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("operator", "node_agent")),
        }
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        if ready_timeout:
            wait_for(f"{self.what} ready", self.ready, timeout=ready_timeout)

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"{self.what} exited with {self.proc.returncode}:\n{self.log_tail()}"
            )
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
            self.proc.wait(timeout=self.kill_timeout)
        self.proc = None

    def log_tail(self, lines: int | None = None) -> str:
        if not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-(lines or self.tail_lines) :])


class AgentProcess(ServiceProcess):
    what = "agent"

    def __init__(
        self,
        plane: LocalPlane,
        workdir: Path,
        nodes: list[str],
        *,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(plane, workdir, "agent.log")
        self.nodes = nodes
        self.extra = extra or []
        self.env = env or {}

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def cdi_dir(self) -> Path:
        return self.workdir / "cdi"

    def start(self, *, env: dict[str, str] | None = None) -> AgentProcess:
        self.port = free_port()
        args = [
            sys.executable, "-m", "vnpu_agent.main",
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--simulate-nodes={','.join(self.nodes)}",
            f"--state-dir={self.state_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.port}",
            "--resync-seconds=0.5",
            "--gc-grace-seconds=2",
            "--inventory-min-interval-seconds=0.2",
            "--retry-max-seconds=1",
            "--log-level=DEBUG",
            *self.extra,
        ]  # fmt: skip
        self.launch(args, {**self.plane.env(), **self.env, **(env or {})}, ready_timeout=30)
        return self

    def sim(self, node: str) -> SimDriver:
        return SimDriver(self.state_dir / node / "sim" / "state.json")


def allocation(
    name: str,
    *,
    node: str,
    vnpu_id: int,
    template: str = "vir05_1c_16g",
    chip: int = 0,
    pod: str = "pod",
    pod_uid: str = "uid",
) -> dict[str, Any]:
    """An allocation exactly as the operator writes it."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": name,
            "labels": {names.LABEL_NODE: node, names.LABEL_POD_UID: pod_uid},
            "finalizers": [names.ALLOCATION_FINALIZER],
        },
        "spec": {
            "podName": pod,
            "podUID": pod_uid,
            "nodeName": node,
            "chip": chip,
            "template": template,
            "vnpuId": vnpu_id,
        },
    }


def create(plane: LocalPlane, namespace: str, obj: dict[str, Any]) -> None:
    plane.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))


def get_alloc(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any] | None:
    r = plane.kubectl(
        "get", names.ALLOCATION_PLURAL, name, "-n", namespace, "-o", "json", check=False
    )
    if r.returncode != 0:
        assert "NotFound" in r.stderr, r.stderr
        return None
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def phase(plane: LocalPlane, namespace: str, name: str) -> str | None:
    obj = get_alloc(plane, namespace, name)
    return None if obj is None else obj.get("status", {}).get("phase")


def vnpu_ids(sim: SimDriver) -> dict[int, str]:
    out = {}
    for chip in sim.list_chips():
        for v in sim.list_vnpus(chip.index):
            out[v.id] = v.template
    return out
