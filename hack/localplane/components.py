"""Our components as real processes against a local plane: `vnpu-agent` and
`vnpu-operator` with their settings, log file, /readyz and /metrics.

The integration tests, the benchmark and the demo all start them through
these classes, so the three run the components the same way and differ only
in the settings they pass.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path

from localplane import sourceroots
from localplane.plane import LocalPlane, free_port
from localplane.waiting import wait_for
from vnpu_agent.drivers.sim import SimDriver

AGENT_NAMESPACE = "vnpu-system"

# The child processes import our packages from the source tree, not from
# whatever the interpreter has installed: every source root (localplane.sourceroots).
SOURCE_ROOTS = tuple(sourceroots.root_names())

Settings = Mapping[str, str | int | float]


def flags(settings: Settings) -> list[str]:
    """`{"log-level": "INFO"}` -> `["--log-level=INFO"]`."""
    return [f"--{key}={value}" for key, value in settings.items()]


class ServiceProcess:
    """One of our commands (`python -m <module>`) running against the plane:
    its log file, its /readyz and /metrics, and signals. Subclasses build the
    command line.

    `name` names the log (`<workdir>/<name>.log` unless `log_path` is given)
    and, with `profile_dir`, the cProfile output `<profile_dir>/<name>.prof`,
    written when the process stops on SIGTERM.
    """

    what = "process"
    module = ""
    kill_timeout = 20.0
    tail_lines = 40

    def __init__(
        self,
        plane: LocalPlane,
        workdir: Path,
        *,
        name: str | None = None,
        log_path: Path | None = None,
        profile_dir: Path | None = None,
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.name = name or self.what
        self.log_path = log_path or workdir / f"{self.name}.log"
        self.profile_dir = profile_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self, args: list[str], env: dict[str, str], *, ready_timeout: float) -> None:
        """Starts the module with `args`, our source roots on PYTHONPATH and
        output to the log; waits for /readyz unless `ready_timeout` is 0."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        python = [sys.executable]
        if self.profile_dir is not None:
            # cProfile writes its file at exit and says nothing when the
            # folder is missing.
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            python += ["-m", "cProfile", "-o", str(self.profile_dir / f"{self.name}.prof")]
        env = {
            **env,
            "PYTHONPATH": sourceroots.pythonpath(),
        }
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [*python, "-m", self.module, *args], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()
        if ready_timeout:
            wait_for(f"{self.name} ready", self.ready, timeout=ready_timeout)

    def ready(self) -> bool:
        """Whether /readyz answers 200; raises if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
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
        """Sends `sig` and waits for the exit (at most `kill_timeout` s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=self.kill_timeout)
            except subprocess.TimeoutExpired:
                # A hung shutdown is a defect of the component: name it with
                # the log (its last lines say where it stuck), and still
                # leave no process behind for the next test.
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                raise AssertionError(
                    f"{self.name} did not exit within {self.kill_timeout:g}s of signal "
                    f"{signal.Signals(sig).name}:\n{self.log_tail(80)}"
                ) from None
            if sig == signal.SIGTERM and self.proc.returncode != 0:
                code, self.proc = self.proc.returncode, None
                raise AssertionError(
                    f"{self.name} exited with {code} on SIGTERM, not 0:\n{self.log_tail(80)}"
                )
        self.proc = None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a profile is written then), SIGKILL if the process is
        still there `timeout` s later."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int | None = None) -> str:
        if not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-(lines or self.tail_lines) :])


class AgentProcess(ServiceProcess):
    """`vnpu-agent` simulating `nodes`, its driver state and CDI specs under
    `workdir`."""

    what = "agent"
    module = "vnpu_agent.main"

    # Short enough that a test or the demo sees a resync, a collection or a
    # retry within a second or two; production defaults are far longer.
    QUICK: Settings = {
        "resync-seconds": 0.5,
        "gc-grace-seconds": 2,
        "inventory-min-interval-seconds": 0.2,
        "inventory-settle-seconds": 1,
        "retry-max-seconds": 1,
        "log-level": "DEBUG",
    }

    def __init__(
        self,
        plane: LocalPlane,
        workdir: Path,
        nodes: list[str],
        *,
        settings: Settings | None = None,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        name: str | None = None,
        log_path: Path | None = None,
        profile_dir: Path | None = None,
    ) -> None:
        super().__init__(plane, workdir, name=name, log_path=log_path, profile_dir=profile_dir)
        self.nodes = nodes
        self.settings = self.QUICK if settings is None else settings
        self.extra = extra or []
        self.env = env or {}

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def cdi_dir(self) -> Path:
        return self.workdir / "cdi"

    def start(
        self, *, env: dict[str, str] | None = None, ready_timeout: float = 30
    ) -> AgentProcess:
        """Starts the agent (on a fresh metrics port); `env` adds to this
        start only."""
        self.port = free_port()
        args = [
            f"--kubeconfig={self.plane.agent_kubeconfig}",
            f"--simulate-nodes={','.join(self.nodes)}",
            f"--state-dir={self.state_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--agent-namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.port}",
            *flags(self.settings),
            *self.extra,
        ]
        self.launch(
            args, {**self.plane.env(), **self.env, **(env or {})}, ready_timeout=ready_timeout
        )
        return self

    def sim(self, node: str) -> SimDriver:
        """The simulated driver of one of the agent's nodes."""
        return SimDriver(self.state_dir / node / "sim" / "state.json")


class OperatorProcess(ServiceProcess):
    """`vnpu-operator` with its admission webhooks registered on a loopback URL, as the
    operator's own identity (`LocalPlane.operator_kubeconfig`), which the protection
    policies exempt; a `--kubeconfig` in `extra` overrides it."""

    what = "operator"
    module = "vnpu_operator.main"
    kill_timeout = 30.0
    tail_lines = 60

    # A failed write is retried within two seconds, not the production backoff.
    QUICK: Settings = {"retry-max-seconds": 2, "log-level": "DEBUG"}

    def __init__(
        self,
        plane: LocalPlane,
        workdir: Path,
        *,
        settings: Settings | None = None,
        extra: list[str] | None = None,
        name: str | None = None,
        log_path: Path | None = None,
        profile_dir: Path | None = None,
        webhook_url: str | None = None,
    ) -> None:
        """`webhook_url`: where the API server calls the webhooks (several
        replicas: a `webhookproxy.WebhookProxy` in front of them); None: this
        process's own port."""
        super().__init__(plane, workdir, name=name, log_path=log_path, profile_dir=profile_dir)
        self.settings = self.QUICK if settings is None else settings
        self.extra = extra or []
        self.webhook_port = free_port()
        self.webhook_url = webhook_url
        # Its name in the leader Lease, kept across restarts as a pod's name
        # is across its container's restarts: a restarted process takes its
        # own Lease back at once.
        self.identity = f"{self.name}-{uuid.uuid4().hex[:6]}"

    def start(self, *, ready_timeout: float = 60) -> OperatorProcess:
        """Starts the operator (on a fresh metrics port); waits for /readyz
        unless `ready_timeout` is 0."""
        self.port = free_port()
        args = [
            f"--kubeconfig={self.plane.operator_kubeconfig}",
            f"--agent-namespace={AGENT_NAMESPACE}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.port}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-url={self.webhook_url or f'https://127.0.0.1:{self.webhook_port}'}",
            f"--leader-election-identity={self.identity}",
            *flags(self.settings),
            *self.extra,
        ]
        self.launch(args, self.plane.env(), ready_timeout=ready_timeout)
        return self


def vnpu_ids(sim: SimDriver) -> dict[int, str]:
    """vNPU id -> template of every vNPU the simulated driver holds."""
    out: dict[int, str] = {}
    for chip in sim.list_chips():
        for v in sim.list_vnpus(chip.index):
            out[v.id] = v.template
    return out
