"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok as local processes.

The binaries come from `hack/plane/build.sh` (built from Go modules and
cached). Every component listens on a random free port of 127.0.0.1, so
several planes can run side by side.

Two ways of owning the processes:
- `attached` (pytest): the processes die with the Python process that
  started them (PR_SET_PDEATHSIG), so an interrupted or killed test run
  leaves nothing behind; `stop()` also runs at exit.
- detached (`make cluster-up`): the processes outlive the command; their
  pids are kept in `<workdir>/state.json` for `make cluster-down`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localplane import policies
from localplane.nodes import NodeSpec, node_manifest
from localplane.waiting import wait_for
from vnpu_common.kube import certs
from vnpu_common.wire import names

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "plane" / "build.sh"

# Only writes are audited: the API-economy tests count our components'
# writes per pod lifecycle from this log.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"""


class PlaneError(RuntimeError):
    """The control plane could not be built, started or reached."""


def run_build_script(
    script: Path,
    error: type[PlaneError],
    progress: Callable[[str], None] = lambda _msg: None,
) -> Path:
    """Runs one of our cached build scripts (they log to stderr and print what
    they built on their last stdout line); that path, or `error` with the
    script's last words."""
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    for line in out.stderr.splitlines():
        progress(line)
    if out.returncode != 0:
        name = script.relative_to(REPO_ROOT) if script.is_relative_to(REPO_ROOT) else script
        raise error(f"{name} failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


# Which Kubernetes lane a plane runs when none is named: "1.34" for the older lane of
# hack/plane/versions.env (K8S_LEGACY_VERSION), unset or the main lane's for K8S_VERSION.
LANE_ENV = "VNPU_K8S_LANE"


def _minor(version: str) -> str:
    """`v1.37.2` -> `1.37`."""
    return ".".join(version.lstrip("v").split(".")[:2])


def lanes() -> dict[str, str]:
    """The Kubernetes lanes of versions.env, major.minor -> version: the main lane
    (K8S_VERSION) first, then the older one (K8S_LEGACY_VERSION)."""
    versions = (policies.kube_version("K8S_VERSION"), policies.kube_version("K8S_LEGACY_VERSION"))
    return {_minor(v): v for v in versions}


def main_lane() -> str:
    return next(iter(lanes()))


def default_lane() -> str:
    """`$VNPU_K8S_LANE`, else the main lane."""
    return os.environ.get(LANE_ENV) or main_lane()


def lane_version(lane: str) -> str:
    """The Kubernetes version of `lane` ("1.34" -> "v1.34.4"); PlaneError for a lane
    versions.env does not have."""
    known = lanes()
    if lane not in known:
        raise PlaneError(
            f"no Kubernetes lane {lane!r} (${LANE_ENV}); hack/plane/versions.env has "
            f"{', '.join(known)}"
        )
    return known[lane]


def bin_dir(lane: str | None = None) -> Path:
    """Where build.sh puts (or would put) the binaries of `lane` (the default lane)."""
    lane = lane or default_lane()
    lane_version(lane)
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--lane", lane, "--print"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


REQUIRED_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)


def find_binaries(lane: str | None = None) -> Path:
    """The bin dir of `lane` (the default lane), or a PlaneError that says how to
    build it."""
    bins = bin_dir(lane)
    missing = [b for b in REQUIRED_BINARIES if not (bins / b).is_file()]
    if missing:
        raise PlaneError(
            f"control-plane binaries missing in {bins}: {', '.join(missing)}. "
            "Build them with `make plane` (hack/plane/build.sh, both lanes); "
            "`make test` does this itself."
        )
    return bins


# Ports handed out by this process: a component stopped for a while (the
# operator between a SIGKILL and its restart) must find its port free again.
_HANDED_OUT: set[int] = set()
_LOWEST_PORT = 10000


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port the kernel may give an outgoing connection."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(rng: random.Random | None = None, low: int | None = None) -> int:
    """A port nothing listens on, below the ephemeral range where the room
    allows: a port from that range (the kernel's choice for a bind to port 0)
    can be taken by any client's outgoing connection while its component is
    down, and the operator restarted after a SIGKILL then failed to bind its
    webhook port ("address already in use")."""
    top = (ephemeral_low() if low is None else low) - 1
    pick = rng or random.SystemRandom()
    if top - _LOWEST_PORT >= 1000:
        for _ in range(100):
            port = pick.randint(_LOWEST_PORT, top)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
    _HANDED_OUT.add(chosen)
    return chosen


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: the kernel sends SIGTERM to the child when the
    # thread that forked it exits, even on SIGKILL of the test runner.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)


@dataclass
class Ports:
    etcd: int = 0
    etcd_peer: int = 0
    apiserver: int = 0
    controller_manager: int = 0
    scheduler: int = 0
    kwok: int = 0

    @classmethod
    def pick(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))


@dataclass
class PlaneState:
    workdir: str
    ports: Ports
    pids: dict[str, int] = field(default_factory=dict)

    def save(self) -> None:
        path = Path(self.workdir) / "state.json"
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, workdir: Path) -> PlaneState:
        data = json.loads((workdir / "state.json").read_text())
        return cls(workdir=data["workdir"], ports=Ports(**data["ports"]), pids=data["pids"])


class LocalPlane:
    """Starts and stops one control plane in `workdir`, of Kubernetes `lane` ("1.34";
    `$VNPU_K8S_LANE` or the main lane of hack/plane/versions.env by default)."""

    def __init__(
        self,
        workdir: Path,
        *,
        attached: bool = True,
        bins: Path | None = None,
        lane: str | None = None,
    ) -> None:
        self.workdir = workdir.resolve()
        self.attached = attached
        self.lane = lane or default_lane()
        # The version the API server, controller-manager and scheduler are of.
        self.k8s_version = lane_version(self.lane)
        self.bins = bins or find_binaries(self.lane)
        self.ports = Ports.pick()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stopped = False
        self._policies_installed = False
        # Set by `open_to_pods` (a real node's pod network): the API server then
        # also listens where pods reach it and can call kubelets and endpoints.
        self.pod_gateway: str | None = None
        # Written at `start`: the benchmark adds our components' lists to it.
        self.audit_policy = AUDIT_POLICY

    # -- paths -------------------------------------------------------------

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        """The admin's: client certificate in group system:masters."""
        return self.workdir / "kubeconfig"

    @property
    def operator_kubeconfig(self) -> Path:
        """The operator's own identity (`policies.OPERATOR_USER`, in group system:masters
        so that its RBAC is unrestricted here): the protection policies recognise the
        operator's requests by this username, as they do the chart's ServiceAccount."""
        return self.workdir / "operator.kubeconfig"

    @property
    def agent_kubeconfig(self) -> Path:
        """The agents' identity (`policies.AGENT_USER`, in group system:masters): the
        allocation policy lets the agents change allocations, an admin only remove
        their finalizers."""
        return self.workdir / "agent.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    def binary(self, name: str) -> str:
        return str(self.bins / name)

    # -- lifecycle ---------------------------------------------------------

    def start(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        if self.attached:
            atexit.register(self.stop)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        try:
            t0 = time.monotonic()
            self._write_pki()
            self._write_kubeconfig(self.kubeconfig, "admin")
            self._write_kubeconfig(self.operator_kubeconfig, policies.OPERATOR_USER)
            self._write_kubeconfig(self.agent_kubeconfig, policies.AGENT_USER)
            progress("starting etcd")
            self._start_etcd()
            progress("starting kube-apiserver")
            self._start_apiserver()
            progress("starting kube-controller-manager, kube-scheduler, kwok")
            self._start_controller_manager()
            self._start_scheduler()
            self._start_kwok()
            self._wait_controllers()
            progress("installing the protection policies")
            self.install_policies()
            progress(
                f"control plane (Kubernetes {self.k8s_version}) ready in "
                f"{time.monotonic() - t0:.1f}s"
            )
        except BaseException:
            self.stop()
            raise
        if not self.attached:
            PlaneState(
                str(self.workdir), self.ports, {n: p.pid for n, p in self.procs.items()}
            ).save()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    @staticmethod
    def stop_detached(workdir: Path) -> bool:
        """Stops a plane started with `attached=False`; False if none ran."""
        try:
            state = PlaneState.load(workdir)
        except FileNotFoundError:
            return False
        for pid in reversed(list(state.pids.values())):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for pid in state.pids.values():
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        (workdir / "state.json").unlink()
        return True

    # -- components --------------------------------------------------------

    def _spawn(
        self, name: str, args: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            list(args),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            start_new_session=not self.attached,
            preexec_fn=_die_with_parent if self.attached else None,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def _write_pki(self) -> None:
        self.pki.mkdir(exist_ok=True)
        ca = certs.make_ca("vnpu-localplane-ca")
        ca.write(self.ca_file, self.pki / "ca.key")
        self._write_apiserver_cert(ca)
        certs.issue(
            ca, "admin", organizations=("system:masters",), server=False, client=True
        ).write(self.pki / "admin.crt", self.pki / "admin.key")
        for user in (policies.OPERATOR_USER, policies.AGENT_USER):
            certs.issue(
                ca, user, organizations=("system:masters",), server=False, client=True
            ).write(self.pki / f"{user}.crt", self.pki / f"{user}.key")
        sa_key, sa_pub = certs.rsa_keypair()
        (self.pki / "sa.key").write_bytes(sa_key)
        (self.pki / "sa.pub").write_bytes(sa_pub)
        (self.workdir / "audit-policy.yaml").write_text(self.audit_policy)

    def ca(self) -> certs.KeyPair:
        """The plane's CA, to sign certificates for more clients (a real node's kubelet)."""
        return certs.KeyPair(self.ca_file.read_bytes(), (self.pki / "ca.key").read_bytes())

    def _write_apiserver_cert(self, ca: certs.KeyPair) -> None:
        gateway = (self.pod_gateway,) if self.pod_gateway else ()
        certs.issue(
            ca,
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=("127.0.0.1", "10.0.0.1", *gateway),
        ).write(self.pki / "apiserver.crt", self.pki / "apiserver.key")

    def _write_kubeconfig(self, path: Path, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "localplane",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate": str(self.pki / f"{user}.crt"),
                        "client-key": str(self.pki / f"{user}.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "localplane", "context": {"cluster": "localplane", "user": user}}
            ],
            "current-context": "localplane",
        }
        path.write_text(yaml.safe_dump(config))

    def _start_etcd(self) -> None:
        p = self.ports
        self._spawn(
            "etcd",
            [
                self.binary("etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p.etcd}",
                f"--advertise-client-urls=http://127.0.0.1:{p.etcd}",
                f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{p.etcd_peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait_http("etcd", f"http://127.0.0.1:{p.etcd}/health", timeout=60)

    def _start_apiserver(self) -> None:
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait_http("kube-apiserver", f"{self.server}/readyz", timeout=120, tls=True)

    def _apiserver_args(self) -> list[str]:
        p, pki = self.ports, self.pki
        real_node: list[str] = []
        if self.pod_gateway:
            real_node = [
                # No kube-proxy: a webhook behind a Service is called at its
                # endpoint's address, not at the ClusterIP nothing routes.
                "--enable-aggregator-routing=true",
                # logs, exec, port-forward on a real kubelet (webhook authn/authz).
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            ]
        return [
            self.binary("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd}",
            # Pods on a real node's bridge reach the host only at the
            # gateway, an address that exists once the bridge does.
            f"--bind-address={'0.0.0.0' if self.pod_gateway else '127.0.0.1'}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--secure-port={p.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            # Tests and the benchmark read the log by offset; the default
            # rotates it at 100 MB, which the 1000-node benchmark passes twice.
            "--audit-log-maxsize=1000000",
            # The defaults (400/200 in flight) are far above what a 2-core
            # machine serves; lower limits only add 429s under churn.
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            *real_node,
            "--v=1",
        ]

    def kill_apiserver(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        """Sends `sig` to kube-apiserver and waits until it has exited: what
        the other components and our clients see when it crashes (SIGKILL:
        no graceful close of watches, requests in flight cut) or shuts down
        (SIGTERM). A shutdown still going on after `timeout` s ends with
        SIGKILL, so the plane is never left with a server half gone (the
        plane's kube-apiserver 1.34 stops listening at once on SIGTERM but
        then lingers, its watches open, for longer than a minute)."""
        proc = self.procs["kube-apiserver"]
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def start_apiserver(self) -> None:
        """Starts kube-apiserver again after `kill_apiserver`, with the same
        flags, port, certificates and etcd (so every object and resource
        version survives), and waits until /readyz answers."""
        if self.procs["kube-apiserver"].poll() is None:
            raise PlaneError("kube-apiserver is still running; kill_apiserver() first")
        self._start_apiserver()
        if not self.attached:
            PlaneState(
                str(self.workdir), self.ports, {n: p.pid for n, p in self.procs.items()}
            ).save()

    def restart_apiserver(self, sig: int = signal.SIGKILL) -> None:
        """`kill_apiserver(sig)` then `start_apiserver()`: an API server crash
        and restart, as a supervisor (kubelet, systemd) would do it."""
        self.kill_apiserver(sig)
        self.start_apiserver()

    def open_to_pods(self, gateway: str) -> None:
        """What a real node's pods and kubelet need from the API server, without
        kube-proxy: it listens on every address (pods reach it at their bridge's
        `gateway`, also added to its certificate's SANs), routes webhook and
        aggregated calls to Service endpoints directly, and presents a client
        certificate (group system:masters) to kubelets for logs and exec.
        Restarts the API server with these settings (same port, etcd and
        objects); a no-op when already open to `gateway`."""
        if self.pod_gateway == gateway:
            return
        self.pod_gateway = gateway
        ca = self.ca()
        self._write_apiserver_cert(ca)
        certs.issue(
            ca,
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
            server=False,
            client=True,
        ).write(
            self.pki / "apiserver-kubelet-client.crt", self.pki / "apiserver-kubelet-client.key"
        )
        self.restart_apiserver()

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                # Delegated authn/authz, as the scheduler's: the admin may read /metrics
                # (the feature gates it runs with, tests/integration/test_dra_plane.py).
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.controller_manager}",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs=20",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.scheduler}",
                "--leader-elect=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )

    def _start_kwok(self) -> None:
        self._spawn(
            "kwok",
            [
                self.binary("kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.1.0.1",
                # Node Leases, as kubelets have renewed them since 1.17: node status is
                # then written rarely. Without them kwok heartbeats every node's status
                # often enough to load the API server, yet under load not often enough
                # for the controller-manager, which marks nodes NotReady and taints them.
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{self.ports.kwok}",
                f"--config={REPO_ROOT / 'hack' / 'plane' / 'kwok-stages.yaml'}",
            ],
        )

    def _wait_controllers(self) -> None:
        self._wait_http(
            "kube-controller-manager",
            f"https://127.0.0.1:{self.ports.controller_manager}/healthz",
            timeout=90,
            tls=True,
        )
        self._wait_http(
            "kube-scheduler",
            f"https://127.0.0.1:{self.ports.scheduler}/healthz",
            timeout=90,
            tls=True,
        )
        self._wait_http("kwok", f"http://127.0.0.1:{self.ports.kwok}/healthz", timeout=60)
        # The service-account controller creating `default` proves the
        # controller manager is acting on the API, not just listening.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
            if r.returncode == 0:
                return
            time.sleep(0.5)
        raise PlaneError("kube-controller-manager did not create the default service account")

    # -- helpers -----------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        # Controller-manager and scheduler serve self-signed certificates.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _wait_http(self, name: str, url: str, *, timeout: float, tls: bool = False) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise PlaneError(
                    f"{name} exited with code {proc.returncode}:\n{self.log_tail(name)}"
                )
            try:
                ctx = self._ssl_context() if tls else None
                with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise PlaneError(
            f"{name} not healthy at {url} after {timeout}s ({last}):\n{self.log_tail(name)}"
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def env(self) -> dict[str, str]:
        """Environment for subprocesses that talk to this plane."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bins}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin, or as whoever `kubeconfig` names."""
        proc = subprocess.run(
            [
                self.binary("kubectl"),
                f"--kubeconfig={kubeconfig or self.kubeconfig}",
                f"--cache-dir={self.workdir / 'kube-cache'}",
                *args,
            ],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise PlaneError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def token_kubeconfig(self, path: Path, sa: str, namespace: str, *bound: str) -> Path:
        """A kubeconfig at `path` for ServiceAccount `namespace/sa` with a bearer token
        (`kubectl create token`, `bound` its extra flags such as
        `--bound-object-kind=Node`): the admin's server and CA, no client certificate."""
        token = self.kubectl(
            "create", "token", sa, "-n", namespace, "--duration=1h", *bound
        ).stdout.strip()
        if not token:
            raise PlaneError(f"no token for {namespace}/{sa}")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "localplane",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [{"name": sa, "context": {"cluster": "localplane", "user": sa}}],
            "current-context": sa,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def get_json(self, *args: str, timeout: float = 60) -> Any:
        """`kubectl get <args> -o json`, parsed; None where kubectl fails
        (the object is not there)."""
        out = self.kubectl("get", *args, "-o", "json", check=False, timeout=timeout)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def quota_used(self, namespace: str, name: str) -> dict[str, str]:
        """What ResourceQuota `namespace/name` counts as used (its status);
        {} while the quota controller has not counted yet, or without it."""
        quota = self.get_json("resourcequota", name, "-n", namespace) or {}
        return dict((quota.get("status") or {}).get("used") or {})

    def apply(self, manifest: dict[str, Any] | str | Path) -> None:
        if isinstance(manifest, Path):
            self.kubectl("apply", "--server-side", "-f", str(manifest))
            return
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        self.kubectl("apply", "--server-side", "-f", "-", input=text)

    def install_crds(self, crd_dir: Path = REPO_ROOT / "crds") -> list[str]:
        """Applies every CRD in `crd_dir` and waits until each is Established."""
        files = sorted(crd_dir.glob("*.yaml"))
        crd_names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
        for f in files:
            self.apply(f)
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *(f"crd/{n}" for n in crd_names),
            timeout=90,
        )
        # kubectl's discovery cache predates the new resources and categories.
        shutil.rmtree(self.workdir / "kube-cache", ignore_errors=True)
        if self._policies_installed:
            # Started before the CRDs: only now can the allocation policy be probed.
            self._wait_policies(enforced=True)
        return crd_names

    # -- protection policies -----------------------------------------------

    def install_policies(self) -> None:
        """Applies the chart's protection policies (`localplane.policies`), exempting the
        operator's local identity; `start` does, before any of our components runs. Once
        the allocation CRD exists, waits until the API server enforces them."""
        self.apply(self._policy_manifests())
        self._policies_installed = True
        if self._allocation_crd_established():
            self._wait_policies(enforced=True)

    def remove_policies(self) -> None:
        """Deletes them and waits until they no longer apply: a release of the chart
        brings its own, exempting its ServiceAccount, and with both every operator would be
        refused by one of them. Tests that install the chart call this first and
        `install_policies` after uninstalling it."""
        self.kubectl("delete", "--ignore-not-found", "-f", "-", input=self._policy_manifests())
        self._policies_installed = False
        if self._allocation_crd_established():
            self._wait_policies(enforced=False)

    def _policy_manifests(self) -> str:
        return policies.render(
            self.binary("helm"), self.workdir / "helm-policies", self.k8s_version
        )

    def _allocation_crd_established(self) -> bool:
        crd = self.get_json("crd", f"{names.ALLOCATION_PLURAL}.{names.GROUP}") or {}
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    def _wait_policies(self, *, enforced: bool) -> None:
        """Policies apply once the API server's informer has them, a moment after the
        write: probes with a dry-run allocation created by the admin."""
        probe = yaml.safe_dump(policies.probe_allocation())

        def settled() -> bool:
            out = self.kubectl(
                "create", "--dry-run=server", "-n", "default", "-f", "-",
                input=probe, check=False,
            )  # fmt: skip
            if out.returncode == 0:
                return not enforced
            if policies.NOT_THE_OPERATOR in out.stderr:
                return enforced
            raise PlaneError(f"policy probe failed: {out.stderr.strip()}")

        wait_for(f"protection policies {'enforced' if enforced else 'lifted'}", settled, 30)

    def add_nodes(self, specs: Sequence[NodeSpec], *, wait: bool = True) -> None:
        """Creates kwok nodes and waits until kwok reports them Ready."""
        items = [node_manifest(s) for s in specs]
        self.kubectl(
            "create",
            "-f",
            "-",
            input=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        if wait:
            self.kubectl(
                "wait",
                "--for=condition=Ready",
                "--timeout=60s",
                *(f"node/{s.name}" for s in specs),
                timeout=90,
            )

    def rmtree(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    return True
