"""One real node next to a local plane's kwok nodes: containerd + runc + CNI
bridge and a real kubelet, registered under the machine's hostname.

The tools come from `hack/node/build.sh` (docs/REAL-NODE.md says where each
comes from and why every setting below is needed on this kind of machine).
The kubelet's `/var/lib/kubelet` (its device-plugin directory is fixed there)
and the runc shims' `/run/containerd` are host-wide paths, so there can be one
real node per machine: a lock file enforces it, and `stop()` removes
everything the node left on the host (containers, mounts, network namespaces,
the bridge, cgroups, the Node object) so that the next start begins clean.

Needs root: containerd and the kubelet mount, create namespaces and cgroups.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import yaml

from localplane import ociimage, policies
from localplane.nodes import node_ready
from localplane.plane import REPO_ROOT, LocalPlane, PlaneError, run_build_script
from localplane.waiting import wait_for
from vnpu_agent.cdi import CDI_KIND
from vnpu_agent.drivers.sim import NULL_DEVICE
from vnpu_common.kube import certs

NODE_BUILD_SCRIPT = REPO_ROOT / "hack" / "node" / "build.sh"
LOCK_FILE = Path("/run/vnpu-localplane-realnode.lock")
# Host paths the kubelet and the shims use whatever they are told.
KUBELET_ROOT = Path("/var/lib/kubelet")
CONTAINERD_RUN = Path("/run/containerd")
CGROUP_ROOT = Path("/sys/fs/cgroup")

BRIDGE = "vnpu-cni0"
POD_SUBNET = "10.88.0.0/24"
POD_GATEWAY = "10.88.0.1"
# The label that marks the real node; kwok manages only nodes annotated for it.
REAL_NODE_LABEL = "localplane.vnpu.io/real-node"
IMAGE_REPO = "localhost/vnpu-localplane"
# The tests' plain-container image: static busybox (hack/node/build.sh).
TEST_IMAGE = f"{IMAGE_REPO}/busybox:1"

# The Ascend Docker Runtime stand-in (ascend_runtime.py), a containerd runtime
# handler selected by this RuntimeClass, which the plane gets with the node.
ASCEND_RUNTIME = Path(__file__).with_name("ascend_runtime.py")
ASCEND_HANDLER = policies.ASCEND_RUNTIME_CLASS
ASCEND_RUNTIME_CLASS: dict[str, Any] = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": ASCEND_HANDLER},
    "handler": ASCEND_HANDLER,
}

# The test device plugin (hack/node/cdi-test-plugin) registers resources
# under this prefix; its Allocate answers name CDI devices of this kind.
CDI_TEST_RESOURCE_PREFIX = "cdi-test.vnpu.io"

_MNT_DETACH = 2


class RealNodeError(PlaneError):
    """The real node cannot start here, or did not come up."""


# The kubelet's API port (its default; the config does not move it).
KUBELET_PORT = 10250


def node_tools(progress: Callable[[str], None] = lambda _msg: None) -> Path:
    """Builds (or reuses) the node tools; the directory that holds them."""
    return run_build_script(NODE_BUILD_SCRIPT, RealNodeError, progress)


def primary_ip() -> str:
    """The address of the interface the default route leaves by. The kubelet
    refuses a loopback --node-ip. (A UDP connect sends nothing.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))
        except OSError as exc:
            raise RealNodeError(f"no default route, so no node IP: {exc}") from exc
        ip: str = s.getsockname()[0]
    if ip.startswith("127."):
        raise RealNodeError(f"the primary interface's address is loopback ({ip})")
    return ip


def require_root() -> None:
    if os.geteuid() != 0:
        raise RealNodeError(
            "the real node needs root (containerd and the kubelet mount filesystems and "
            "create network namespaces and cgroups); run the real-node tests as root "
            "(`sudo make test-realnode`)"
        )


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and such escaped as \\ooo.
        raw = line.split()[4]
        points.append(raw.encode().decode("unicode_escape"))
    return points


def _under(path: str, roots: tuple[Path, ...]) -> bool:
    return any(path == str(r) or path.startswith(f"{r}/") for r in roots)


class RealNode:
    """A kubelet + containerd node named after this machine, joined to `plane`."""

    def __init__(self, plane: LocalPlane, workdir: Path | None = None) -> None:
        self.plane = plane
        self.workdir = (workdir or plane.workdir / "realnode").resolve()
        self.name = socket.gethostname().lower()
        self.tools: Path | None = None
        self.node_ip = ""
        self.timings: dict[str, float] = {}
        self._lock: IO[str] | None = None
        # The workdir of a node that held the lock before and may have left
        # mounts there (a run killed before its stop()).
        self._previous: Path | None = None
        self._started = False
        # Resource name -> process name of running test device plugins.
        self._cdi_plugins: dict[str, str] = {}

    # -- paths -------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def device_dir(self) -> Path:
        """Where the `ascend` runtime looks for host device nodes (the
        agent's --sim-device-dir): /dev on an Ascend host, here a directory
        of our own so that tests never touch /dev."""
        return self.workdir / "dev"

    def add_davinci_manager(self) -> None:
        """The control device an Ascend host has and the runtime adds to every
        vNPU container: the sim's null device here."""
        manager = self.device_dir / "davinci_manager"
        self.device_dir.mkdir(parents=True, exist_ok=True)
        manager.unlink(missing_ok=True)
        os.mknod(manager, stat.S_IFCHR | 0o666, os.makedev(*NULL_DEVICE))

    @property
    def cdi_dir(self) -> Path:
        """containerd's only CDI spec directory: an agent that should have its
        specs injected writes them here (--cdi-dir)."""
        return self.workdir / "cdi"

    def tool(self, name: str) -> str:
        if self.tools is None:
            raise RealNodeError("node tools not resolved; start() first")
        return str(self.tools / name)

    # -- lifecycle ---------------------------------------------------------

    def start(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        """Starts containerd and the kubelet and waits until the Node is Ready.
        Raises RealNodeError without root or when another real node runs."""
        require_root()
        self._acquire_lock()
        atexit.register(self.stop)
        try:
            t0 = time.monotonic()
            self.tools = node_tools(progress)
            self.timings["node_tools"] = time.monotonic() - t0
            self.node_ip = primary_ip()
            # A node a crashed run left behind (its lock died with it).
            self._clean_host()
            self.workdir.mkdir(parents=True, exist_ok=True)
            t1 = time.monotonic()
            progress("opening the API server to the node's pods")
            self.plane.open_to_pods(POD_GATEWAY)
            self.timings["apiserver_restart"] = time.monotonic() - t1
            t2 = time.monotonic()
            self._write_pki()
            self._write_ascend_runtime()
            progress("starting containerd")
            self._start_containerd()
            self._import_images()
            progress(f"starting the kubelet as node {self.name} ({self.node_ip})")
            self._start_kubelet()
            self._wait_ready()
            self.plane.apply(ASCEND_RUNTIME_CLASS)
            self.timings["node_start"] = time.monotonic() - t2
            progress(f"real node {self.name} Ready in {self.timings['node_start']:.1f}s")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Tears the node down (idempotent): kubelet, every container, containerd,
        shims, mounts, network namespaces, bridge, cgroups, the Node object and
        the pods bound to it."""
        if self._lock is None:
            return
        t0 = time.monotonic()
        try:
            for resource in list(self._cdi_plugins):
                self.stop_cdi_test_plugin(resource)
            self._stop_process("kubelet")
            if self.tools is not None:
                self._remove_containers()
            self._stop_process("containerd")
            self._clean_host()
            self._forget_node()
        finally:
            self._release_lock()
            self.timings["node_stop"] = time.monotonic() - t0

    # -- one per machine ---------------------------------------------------

    def _acquire_lock(self) -> None:
        if self._lock is not None:
            raise RealNodeError("this real node is already started")
        lock = open(LOCK_FILE, "a+")  # noqa: SIM115 - held while the node runs
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise RealNodeError(
                f"a real node already runs on this machine ({holder}); there can be one per "
                f"machine because the kubelet and the runc shims use the fixed host paths "
                f"{KUBELET_ROOT} and {CONTAINERD_RUN}. Stop it first."
            ) from None
        lock.seek(0)
        previous = lock.read().strip().partition(", workdir ")[2]
        self._previous = Path(previous) if previous else None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}, workdir {self.workdir}\n")
        lock.flush()
        self._lock = lock

    def _release_lock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    # -- configuration -----------------------------------------------------

    def _write_pki(self) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        ca = self.plane.ca()
        # The Node authorizer and NodeRestriction know a kubelet by this name.
        certs.issue(
            ca,
            f"system:node:{self.name}",
            organizations=("system:nodes",),
            server=False,
            client=True,
        ).write(self.pki / "kubelet-client.crt", self.pki / "kubelet-client.key")
        # The API server reaches the kubelet through the node's Hostname address.
        certs.issue(
            ca,
            self.name,
            dns_names=(self.name, "localhost"),
            ip_addresses=("127.0.0.1", self.node_ip),
        ).write(self.pki / "kubelet-serving.crt", self.pki / "kubelet-serving.key")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "localplane",
                    "cluster": {
                        "server": self.plane.server,
                        "certificate-authority": str(self.plane.ca_file),
                    },
                }
            ],
            "users": [
                {
                    "name": "kubelet",
                    "user": {
                        "client-certificate": str(self.pki / "kubelet-client.crt"),
                        "client-key": str(self.pki / "kubelet-client.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "localplane", "context": {"cluster": "localplane", "user": "kubelet"}}
            ],
            "current-context": "localplane",
        }
        (self.workdir / "kubelet.kubeconfig").write_text(yaml.safe_dump(config))

    def _write_ascend_runtime(self) -> None:
        # The shim execs BinaryName with runc's arguments only, so the
        # stand-in's settings travel in the environment of a wrapper.
        self.device_dir.mkdir(parents=True, exist_ok=True)
        wrapper = self.workdir / "ascend-runtime"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"export VNPU_STANDIN_RUNC='{self.tool('runc')}'\n"
            f"export VNPU_STANDIN_DEVICE_DIR='{self.device_dir}'\n"
            # The real runtime's CDI mode: ASCEND_VNPU_SPECS creates even under VIRTUAL.
            "export VNPU_STANDIN_SPECS_FIRST=1\n"
            f"exec '{sys.executable}' '{ASCEND_RUNTIME}' \"$@\"\n"
        )
        wrapper.chmod(0o755)

    def _containerd_config(self, pause_image: str) -> str:
        c = self.workdir / "containerd"
        return f"""\
version = 3
root = '{c / "root"}'
state = '{c / "state"}'

[grpc]
  address = '{self.socket}'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{pause_image}'
  [plugins.'io.containerd.cri.v1.runtime']
    # No CAP_SYS_RESOURCE here: runc cannot set a negative oom_score_adj.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    # CDI devices named in a container's CRI config (a device plugin's
    # Allocate answer) come from the agent's specs here, and nowhere else.
    enable_cdi = true
    cdi_spec_dirs = ['{self.cdi_dir}']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        runtime_path = '{self.tool("containerd-shim-runc-v2")}'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{self.tool("runc")}'
          Root = '{c / "runc"}'
          SystemdCgroup = false
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{ASCEND_HANDLER}]
        runtime_type = 'io.containerd.runc.v2'
        runtime_path = '{self.tool("containerd-shim-runc-v2")}'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{ASCEND_HANDLER}.options]
          BinaryName = '{self.workdir / "ascend-runtime"}'
          Root = '{c / "runc"}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{self.tool("cni")}']
      conf_dir = '{self.workdir / "cni" / "net.d"}'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
  [plugins.'io.containerd.internal.v1.opt']
    path = '{c / "opt"}'
  [plugins.'io.containerd.nri.v1.nri']
    socket_path = '{c / "nri.sock"}'
"""

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "vnpu-localplane",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    # No iptables binary on this machine: no masquerading, so
                    # pods reach the host (the API server at the gateway) only.
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                }
            ],
        }

    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # The API server calls in with its kubelet client certificate; the
            # kubelet checks it against the plane's CA and asks the API server
            # (SubjectAccessReview) whether that user may.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.plane.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(self.pki / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(self.pki / "kubelet-serving.key"),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "clusterDomain": "cluster.local",
            # A developer's disk is often fuller than the default thresholds:
            # no evictions and no image GC of the imported images.
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "shutdownGracePeriod": "0s",
        }

    # -- processes ---------------------------------------------------------

    def _start_containerd(self) -> None:
        c = self.workdir / "containerd"
        c.mkdir(parents=True, exist_ok=True)
        net_d = self.workdir / "cni" / "net.d"
        net_d.mkdir(parents=True, exist_ok=True)
        (net_d / "10-vnpu-localplane.conflist").write_text(json.dumps(self._cni_config()))
        (c / "config.toml").write_text(self._containerd_config(self._pause_image()))
        # The CDI library watches its spec dirs; one that is missing at start
        # is only picked up later.
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        # runc is named in the config, but the shim's `-info` probe (which
        # containerd runs for the CRI's runtime status) looks it up on PATH.
        env = {**os.environ, "PATH": f"{self.tools}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.plane._spawn(
            "containerd", [self.tool("containerd"), f"--config={c / 'config.toml'}"], env=env
        )

        def up() -> bool:
            self._check_alive("containerd")
            return self.ctr("version", check=False).returncode == 0

        wait_for("containerd to answer", up, 30)

    def _start_kubelet(self) -> None:
        cfg = self.workdir / "kubelet-config.yaml"
        cfg.write_text(yaml.safe_dump(self._kubelet_config()))
        self.plane._spawn(
            "kubelet",
            [
                self.tool("kubelet"),
                f"--config={cfg}",
                f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.node_ip}",
                f"--node-labels={REAL_NODE_LABEL}=true",
                "--v=1",
            ],
        )

    def restart_kubelet(self) -> None:
        """The kubelet stopped and started again, containerd and the containers
        left running (as `systemctl restart kubelet` does): it wipes the node's
        ResourceSlices at start and prepares its pods' claims again."""
        self._stop_process("kubelet")
        self._start_kubelet()

        def serving() -> bool:
            # The Node's Ready condition is the old kubelet's until the new
            # one reports: its own port is what says it is back.
            self._check_alive("kubelet")
            with socket.socket() as sock:
                sock.settimeout(1.0)
                return sock.connect_ex((self.node_ip, KUBELET_PORT)) == 0

        wait_for("the restarted kubelet's port", serving, 60, interval=0.25)
        self._wait_ready()

    def _wait_ready(self) -> None:
        def ready() -> bool:
            self._check_alive("kubelet")
            self._check_alive("containerd")
            return node_ready(self.plane.get_json("node", self.name) or {})

        try:
            wait_for(f"node {self.name} Ready", ready, 90, interval=0.5)
        except AssertionError as exc:
            raise RealNodeError(
                f"{exc}\nkubelet:\n{self.plane.log_tail('kubelet')}\n"
                f"containerd:\n{self.plane.log_tail('containerd')}"
            ) from None

    def _check_alive(self, name: str) -> None:
        proc = self.plane.procs.get(name)
        if proc is not None and proc.poll() is not None:
            raise RealNodeError(
                f"{name} exited with code {proc.returncode}:\n{self.plane.log_tail(name)}"
            )

    def _stop_process(self, name: str) -> None:
        proc = self.plane.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`ctr` against this node's containerd, in the CRI's namespace."""
        out = subprocess.run(
            [self.tool("ctr"), f"--address={self.socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and out.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)} failed: {out.stderr.strip()}")
        return out

    # -- CDI requester -----------------------------------------------------

    def start_cdi_test_plugin(self, name: str, ids: list[int], kind: str = CDI_KIND) -> str:
        """Registers the extended resource `cdi-test.vnpu.io/<name>` with the
        kubelet, one device per id; a container that requests it gets the CDI
        devices `<kind>=<id>` injected by containerd (from `cdi_dir`). Returns
        the resource name once the Node's allocatable shows it."""
        resource = f"{CDI_TEST_RESOURCE_PREFIX}/{name}"
        if resource in self._cdi_plugins:
            raise RealNodeError(f"the test device plugin for {resource} already runs")
        out = subprocess.run(
            ["bash", str(NODE_BUILD_SCRIPT), "--print-cdi-test-plugin"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        binary = out.stdout.strip()
        if not Path(binary).is_file():
            raise RealNodeError(f"{binary} is not built; start() builds it (hack/node/build.sh)")
        proc = f"cdi-test-plugin-{name}"
        self.plane._spawn(
            proc,
            [binary, f"-resource={resource}", f"-kind={kind}",
             f"-ids={','.join(str(i) for i in ids)}",
             f"-plugin-dir={KUBELET_ROOT / 'device-plugins'}"],
        )  # fmt: skip
        self._cdi_plugins[resource] = proc

        def advertised() -> bool:
            self._check_alive(proc)
            node = self.plane.get_json("node", self.name) or {}
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            return allocatable.get(resource) == str(len(ids))

        try:
            # The kubelet reports a new resource at its next node status
            # update (every 10 s by default).
            wait_for(f"{resource} allocatable on {self.name}", advertised, 60, interval=0.5)
        except AssertionError as exc:
            raise RealNodeError(f"{exc}\n{proc}:\n{self.plane.log_tail(proc)}") from None
        return resource

    def stop_cdi_test_plugin(self, resource: str) -> None:
        """Stops a test device plugin; the kubelet drops its resource."""
        proc = self._cdi_plugins.pop(resource, None)
        if proc is not None:
            self._stop_process(proc)

    # -- images ------------------------------------------------------------

    def _pause_image(self) -> str:
        # Tagged by the binary's cache key (part of the tools directory name).
        key = self.tool("pause").split("-pause-")[-1].split("/")[0]
        return f"{IMAGE_REPO}/pause:{key}"

    def _import_images(self) -> None:
        images = self.workdir / "images"
        pause = images / "pause.tar"
        ociimage.write_archive(
            pause,
            self._pause_image(),
            ociimage.pause_layer(Path(self.tool("pause"))),
            entrypoint=["/pause"],
        )
        self.import_image(pause)
        busybox = images / "busybox.tar"
        ociimage.write_archive(
            busybox,
            TEST_IMAGE,
            ociimage.busybox_layer(Path(self.tool("busybox"))),
            cmd=["sh"],
        )
        self.import_image(busybox)

    def import_image(self, archive: Path) -> None:
        """Imports an OCI image-layout archive for the CRI (unpacked for its
        snapshotter); pods use it with imagePullPolicy Never."""
        self.ctr("images", "import", "--snapshotter=overlayfs", str(archive))

    # -- teardown ----------------------------------------------------------

    def _remove_containers(self) -> None:
        """Every task and container in containerd's CRI namespace (sandboxes
        are containers too), while containerd still runs."""
        if self.plane.procs.get("containerd") is None or not self.socket.exists():
            return
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--signal=SIGKILL", "--all", task, check=False)
        for task in tasks:
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)
        for sandbox in self.ctr("sandboxes", "ls", "-q", check=False).stdout.split():
            self.ctr("sandboxes", "rm", "--force", sandbox, check=False)

    def _clean_host(self) -> None:
        """Removes what a node leaves on the host, whether it stopped cleanly or
        crashed: processes in the kubelet's pod cgroups and leftover shims of this
        node's tools, mounts under the node's paths (netns, shm, overlays, volumes),
        the bridge, the pod cgroups, and the host directories."""
        for pid in self._leftover_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        workdirs = {self.workdir, *([self._previous] if self._previous else [])}
        roots = (KUBELET_ROOT, CONTAINERD_RUN, *(w / "containerd" for w in workdirs))
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        for _ in range(3):
            points = sorted((p for p in _mount_points() if _under(p, roots)), reverse=True)
            if not points:
                break
            for point in points:
                libc.umount2(point.encode(), _MNT_DETACH)
        left = [p for p in _mount_points() if _under(p, roots)]
        if left:
            raise RealNodeError(f"could not unmount {left}")
        subprocess.run(
            ["ip", "link", "delete", BRIDGE], capture_output=True, check=False, timeout=30
        )
        for cgroup in self._pod_cgroups():
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        shutil.rmtree(KUBELET_ROOT, ignore_errors=True)
        shutil.rmtree(CONTAINERD_RUN, ignore_errors=True)
        shutil.rmtree(self.workdir / "containerd", ignore_errors=True)
        shutil.rmtree(self.workdir / "cni", ignore_errors=True)

    def _pod_cgroups(self) -> list[Path]:
        """The kubelet's cgroup trees (cgroupfs driver: `kubepods` at the root of
        every hierarchy), deepest first so that rmdir works."""
        found: list[Path] = []
        for hierarchy in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else ():
            top = hierarchy / "kubepods"
            if top.is_dir():
                found += [Path(d) for d, _, _ in os.walk(top)]
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    def _leftover_pids(self) -> Iterator[int]:
        for cgroup in self._pod_cgroups():
            procs = cgroup / "cgroup.procs"
            with contextlib.suppress(OSError):
                yield from (int(p) for p in procs.read_text().split())
        if self.tools is None:
            return
        shim = str(self.tools / "containerd-shim-runc-v2")
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "exe") == shim:
                        yield int(entry.name)

    def _forget_node(self) -> None:
        """The Node, its Lease and the pods bound to it, so the next node
        registers afresh and no pod waits for a kubelet that is gone."""
        if self.plane.procs.get("kube-apiserver") is None:
            return
        self.plane.kubectl(
            "delete", "pods", "--all-namespaces",
            f"--field-selector=spec.nodeName={self.name}",
            "--grace-period=0", "--force", "--wait=false",
            check=False,
        )  # fmt: skip
        self.plane.kubectl("delete", "node", self.name, "--ignore-not-found", check=False)
        self.plane.kubectl(
            "delete", "lease", self.name, "-n", "kube-node-lease", "--ignore-not-found",
            check=False,
        )  # fmt: skip
