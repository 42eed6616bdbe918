"""The benchmark's cluster: a local plane, kwok nodes with simulated chips,
agent process(es) in many-nodes mode and the operator, with process stats."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import ROOT
from localplane import LocalPlane, NodeSpec
from localplane.plane import free_port
from localplane.waiting import wait_for
from vnpu_agent.drivers.sim import SimDriver
from vnpu_operator import names

AGENT_NAMESPACE = "vnpu-system"
CLK_TCK = os.sysconf("SC_CLK_TCK")
CHIPS = {"910B3": 4, "310P3": 4}


@dataclass
class ProcStats:
    cpu_seconds: float
    peak_rss_mb: float
    rss_mb: float


def proc_stats(pid: int) -> ProcStats:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    status = Path(f"/proc/{pid}/status").read_text()
    kb = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("VmHWM", "VmRSS"))
    }
    return ProcStats(cpu, kb.get("VmHWM", 0) / 1024, kb.get("VmRSS", 0) / 1024)


class Proc:
    """A python -m process of ours with a /readyz on its metrics port."""

    def __init__(self, name: str, module: str, args: list[str], env: dict[str, str], log: Path):
        self.name = name
        self.port = free_port()
        python = [sys.executable]
        profile = os.environ.get("VNPU_BENCH_PROFILE_DIR")
        if profile:
            # cProfile writes its stats when the process stops (SIGTERM).
            python += ["-m", "cProfile", "-o", str(Path(profile) / f"{name}.prof")]
        self.args = [*python, "-m", module, *args, f"--metrics-port={self.port}"]
        self.env = {
            **env,
            "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("operator", "node_agent")),
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> Proc:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        wait_for(f"{self.name} ready", self.ready, timeout=timeout)
        return self

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stats(self) -> ProcStats:
        assert self.proc is not None
        return proc_stats(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def node_names(count: int) -> list[str]:
    return [f"bn-{i:04d}" for i in range(count)]


class Cluster:
    def __init__(self, workdir: Path, nodes: int, agents: int) -> None:
        self.workdir = workdir
        self.plane = LocalPlane(workdir / "plane")
        self.nodes = node_names(nodes)
        self.agent_count = max(1, min(agents, nodes))
        self.agents: list[Proc] = []
        self.operator: Proc | None = None
        self.webhook_port = free_port()
        self.agent_base: ProcStats | None = None

    @property
    def state_dir(self) -> Path:
        return self.workdir / "agent" / "state"

    def start_plane(self, say: Any) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.plane.start(progress=say)
        self.plane.install_crds()
        self.plane.kubectl("create", "namespace", AGENT_NAMESPACE)
        for ns in ("bench", "bench-floor"):
            self.plane.kubectl("create", "namespace", ns)

    def add_nodes(self, names_: list[str]) -> None:
        # One `kubectl create` of a List per 100 nodes (localplane batches).
        for i in range(0, len(names_), 100):
            batch = [NodeSpec(name=n, chips=CHIPS) for n in names_[i : i + 100]]
            self.plane.add_nodes(batch, wait=False)
        for i in range(0, len(names_), 100):
            self.plane.kubectl(
                "wait", "--for=condition=Ready", "--timeout=120s",
                *(f"node/{n}" for n in names_[i : i + 100]), timeout=150,
            )  # fmt: skip

    def _agent(self, name: str, nodes: list[str], sub: str) -> Proc:
        (self.workdir / "agent").mkdir(parents=True, exist_ok=True)
        state = self.workdir / sub / "state"
        args = [
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--simulate-nodes={','.join(nodes)}",
            f"--state-dir={state}",
            f"--cdi-dir={self.workdir / sub / 'cdi'}",
            f"--namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            "--resync-seconds=30",
            "--inventory-min-interval-seconds=5",
            "--log-level=INFO",
        ]
        return Proc(name, "vnpu_agent.main", args, self.plane.env(), self.workdir / f"{name}.log")

    def measure_agent_base(self) -> ProcStats:
        """An agent serving one throwaway node: the base the per-node cost
        of the real agents is measured over."""
        node = "bn-base"
        self.add_nodes([node])
        base = self._agent("agent-base", [node], "agent-base").start()
        wait_for("base VNPUNode", lambda: self.get("vnpunode", node), timeout=60)
        time.sleep(3)
        self.agent_base = base.stats()
        base.stop()
        for args in (
            ("node", node),
            ("vnpunode", node),
            ("lease", "-n", AGENT_NAMESPACE, names.lease_name(node)),
        ):
            self.plane.kubectl("delete", *args, "--wait=false", check=False)
        return self.agent_base

    def start_agents(self) -> None:
        n = self.agent_count
        shards = [self.nodes[i::n] for i in range(n)]
        self.agents = [self._agent(f"agent-{i}", shard, "agent") for i, shard in enumerate(shards)]
        for a in self.agents:
            a.start(timeout=300)
        want = set(self.nodes)
        wait_for(
            "all VNPUNodes published",
            lambda: want <= {i["metadata"]["name"] for i in self.list("vnpunodes")},
            timeout=300,
            interval=2,
        )

    def start_operator(self) -> None:
        args = [
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--agent-namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-url=https://127.0.0.1:{self.webhook_port}",
            "--log-level=INFO",
        ]
        self.operator = Proc(
            "operator", "vnpu_operator.main", args, self.plane.env(),
            self.workdir / "operator.log",
        ).start(timeout=180)  # fmt: skip

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        # Webhooks with failurePolicy Fail would now refuse every pod.
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.operator is not None:
                self.operator.stop()
        for a in self.agents:
            with contextlib.suppress(Exception):
                a.stop()
        self.plane.stop()

    # -- reads -------------------------------------------------------------

    def get(self, *args: str) -> Any:
        out = self.plane.kubectl("get", *args, "-o", "json", check=False, timeout=120)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def list(self, *args: str) -> list[dict[str, Any]]:
        return list((self.get(*args) or {}).get("items", []))

    def sim(self, node: str) -> SimDriver:
        return SimDriver(self.state_dir / node / "sim" / "state.json")
