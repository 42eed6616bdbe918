"""The benchmark's cluster: a local plane, kwok nodes with simulated chips,
agent process(es) in many-nodes mode and the operator, with process stats."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.snapshot import Spec
from localplane import LocalPlane, NodeSpec
from localplane.components import (
    AGENT_NAMESPACE,
    AgentProcess,
    OperatorProcess,
    ServiceProcess,
    Settings,
)
from localplane.nodes import node_ready
from localplane.waiting import wait_for
from vnpu_agent.config import AgentSettings
from vnpu_common.wire import names

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


@dataclass(frozen=True)
class MachineCpu:
    """The whole machine's CPU seconds so far, all cores together."""

    busy: float  # user, nice, system, irq, softirq
    idle: float  # idle, iowait
    steal: float  # the hypervisor ran someone else on our cores


def machine_cpu(stat: str | None = None) -> MachineCpu:
    """From /proc/stat's first line (`stat`: its text, for tests). Steal
    slows every process alike, so a phase that ran with more of it than the
    phase it is compared with ran on a slower machine."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(x) for x in text.splitlines()[0].split()[1:9]
    )
    return MachineCpu(
        (user + nice + system + irq + softirq) / CLK_TCK, (idle + iowait) / CLK_TCK, steal / CLK_TCK
    )


def worker_threads_cpu(pid: int) -> float:
    """CPU seconds of a process's threads other than its main one. In an
    agent these run the driver calls (`asyncio.to_thread` in NodeAgent._drv
    is its only use of threads): on this bench, the simulator's work, which
    stands in for the chips and their driver and is reported apart from the
    agent's own code. A thread that exited is no longer counted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if task.name == str(pid):
            continue
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread exited meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def stats(service: ServiceProcess) -> ProcStats:
    assert service.proc is not None
    return proc_stats(service.proc.pid)


def profile_dir() -> Path | None:
    """Where the processes write cProfile stats (on SIGTERM), if asked for."""
    where = os.environ.get("VNPU_BENCH_PROFILE_DIR")
    return Path(where) if where else None


# Production intervals where they shape the load; INFO logs, as deployed.
AGENT_SETTINGS: Settings = {
    "resync-seconds": 30,
    "inventory-min-interval-seconds": 5,
    "log-level": "INFO",
}
OPERATOR_SETTINGS: Settings = {"log-level": "INFO"}


def agent_setting(field: str) -> float:
    """An agent setting as the benchmark's agents run with it: AGENT_SETTINGS,
    else AgentSettings' default."""
    given = AGENT_SETTINGS.get(field.replace("_", "-"))
    if given is not None:
        return float(given)
    return float(AgentSettings.model_fields[field].default)


def node_names(count: int) -> list[str]:
    return [f"bn-{i:04d}" for i in range(count)]


# Where a node keeps the files the agent writes per vNPU: the CDI specs go to
# /var/run/cdi on a node, which is tmpfs, and the simulated driver's state
# file stands for a driver that keeps none. On the disk they were about a
# millisecond of the agent's CPU per pod (each an atomic write: a temporary
# file and a rename) that no agent on a node pays (docs/DECISIONS.md).
TMPFS = Path("/dev/shm")


def node_files_dir(workdir: Path) -> Path:
    """A fresh directory on tmpfs for the agents' node files, else `workdir`."""
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="vnpu-bench-node-", dir=TMPFS))
    return workdir


class Cluster:
    def __init__(self, workdir: Path, nodes: int, agents: int) -> None:
        self.workdir = workdir
        self.node_files = node_files_dir(workdir)
        self.plane = LocalPlane(workdir / "plane")
        self.nodes = node_names(nodes)
        self.agent_count = max(1, min(agents, nodes))
        self.agents: list[AgentProcess] = []
        self.operator: OperatorProcess | None = None
        self.agent_base: ProcStats | None = None

    @property
    def state_dir(self) -> Path:
        return self.node_files / "agent" / "state"

    def start_plane(self, say: Any) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.plane.start(progress=say)
        self.plane.install_crds()
        self.plane.kubectl("create", "namespace", AGENT_NAMESPACE)
        for ns in ("bench", "bench-floor"):
            self.plane.kubectl("create", "namespace", ns)

    def add_nodes(
        self,
        names_: list[str],
        *,
        chips: Mapping[str, int] = CHIPS,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """kwok nodes with `chips` simulated (none: a node for ordinary pods,
        bench/shared.py) and `labels`, once all are Ready."""
        # One `kubectl create` of a List per 50 nodes, five at a time: kubectl
        # posts a List's items one by one, so 1000 nodes in sequence took 39 s
        # of round trips, and 19 s so (2 cores, 2026-11-23).
        batches = [
            [NodeSpec(name=n, chips=chips, labels=labels or {}) for n in names_[i : i + 50]]
            for i in range(0, len(names_), 50)
        ]
        with ThreadPoolExecutor(5) as pool:
            list(pool.map(lambda batch: self.plane.add_nodes(batch, wait=False), batches))
        # One LIST every 2 s, not `kubectl wait`: that reads its nodes one at
        # a time, and at 1000 nodes reported them Ready 195 s after creation
        # although a LIST showed every one Ready within about 30 s.
        want = set(names_)
        wait_for(
            f"{len(want)} nodes Ready",
            lambda: want <= {n["metadata"]["name"] for n in self.list("nodes") if node_ready(n)},
            timeout=300,
            interval=2,
        )

    def _agent(
        self, name: str, nodes: list[str], sub: str, extra: list[str] | None = None
    ) -> AgentProcess:
        """Agent `name` (log `<name>.log`) keeping its state under `sub`/,
        with `extra` flags (bench/dra.py: `--dra true`)."""
        return AgentProcess(
            self.plane, self.node_files / sub, nodes, settings=AGENT_SETTINGS, name=name,
            log_path=self.workdir / f"{name}.log", profile_dir=profile_dir(), extra=extra,
        )  # fmt: skip

    def measure_agent_base(self) -> ProcStats:
        """An agent serving one throwaway node: the base the per-node cost
        of the real agents is measured over."""
        node = "bn-base"
        self.add_nodes([node])
        base = self._agent("agent-base", [node], "agent-base").start(ready_timeout=120)
        wait_for("base VNPUNode", lambda: self.get("vnpunode", node), timeout=60)
        time.sleep(3)
        self.agent_base = stats(base)
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
            a.start(ready_timeout=300)
        want = set(self.nodes)
        wait_for(
            "all VNPUNodes published",
            lambda: want <= {i["metadata"]["name"] for i in self.list("vnpunodes")},
            timeout=300,
            interval=2,
        )

    def start_agent(self, name: str, nodes: list[str], sub: str, extra: list[str]) -> AgentProcess:
        """One more agent process serving `nodes` with `extra` flags (bench/dra.py:
        the DRA nodes' agent), counted with the others from now on."""
        agent = self._agent(name, nodes, sub, extra).start(ready_timeout=300)
        self.agents.append(agent)
        return agent

    def start_operator(self) -> None:
        self.operator = OperatorProcess(
            self.plane, self.workdir, settings=OPERATOR_SETTINGS, profile_dir=profile_dir()
        ).start(ready_timeout=180)

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
        if self.node_files != self.workdir:
            shutil.rmtree(self.node_files, ignore_errors=True)

    # -- reads -------------------------------------------------------------

    def get(self, *args: str) -> Any:
        out = self.plane.kubectl("get", *args, "-o", "json", check=False, timeout=120)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def list(self, *args: str) -> list[dict[str, Any]]:
        return list((self.get(*args) or {}).get("items", []))

    def snapshot_spec(self, *, final: bool) -> Spec:
        """What the correctness snapshot of these nodes reads (bench/snapshot.py)."""
        kubectl = [
            str(self.plane.binary("kubectl")),
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--cache-dir={self.plane.workdir / 'kube-cache'}",
        ]
        return Spec(kubectl, list(self.nodes), str(self.state_dir), final)
