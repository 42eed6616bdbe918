"""`make demo-node`: the story on a real node (root): a real kubelet with
containerd joins a local control plane, the product image built from
Dockerfile is installed by the Helm chart, and containers see their vNPUs.

Steps: local plane; one real node named after this machine (kubelet,
containerd, runc, the Ascend runtime stand-in); the product image built
without Docker and imported into containerd; `helm install` of the chart with
the operator and a simulated-chip agent on that node; two pods asking for
vNPUs; `kubectl exec` shows each container's ASCEND_VISIBLE_DEVICES and
/dev/davinci<id>; one pod is deleted and its vNPU outlives its container's
grace period; then the documented uninstall. Exits non-zero, with the
reason, if anything is not as shown. `make demo` is the fast kwok story.

Needs `hack` (the localplane package) on PYTHONPATH; `make demo-node` sets it.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from localplane import LocalPlane, productimage
from localplane.chart import CHART, RELEASE, helm_ok, real_node_values
from localplane.plane import PlaneError
from localplane.pods import vnpu_pod
from localplane.realnode import TEST_IMAGE, RealNode
from localplane.waiting import wait_for
from vnpu_common.wire import names

NAMESPACE = "vnpu-system"
WORK = "demo-node"
RUNTIME_CLASS = "vnpu-ascend"
CHIPS = "910B3=2"
# The container ignores nothing: SIGTERM ends it after a visible 3 s of cleanup,
# the time its vNPU must outlive.
MAIN = 'trap "echo cleaning up; sleep 3; exit 0" TERM; while :; do sleep 1; done'


SHOW = "echo ASCEND_VISIBLE_DEVICES=$ASCEND_VISIBLE_DEVICES; ls /dev/davinci*"


class DemoError(Exception):
    """Something is not as the demo says it is."""


def banner(title: str, text: str = "") -> None:
    print(f"\n=== {title}", flush=True)
    if text:
        print("    " + " ".join(text.split()), flush=True)


def kubectl(plane: LocalPlane, *args: str) -> str:
    """Runs kubectl as a user would type it and prints command and output."""
    print(f"$ kubectl {shlex.join(args)}", flush=True)
    out = plane.kubectl(*args, check=False, timeout=120)
    text = (out.stdout + out.stderr).rstrip()
    if text:
        print(text, flush=True)
    if out.returncode != 0:
        raise DemoError(f"`kubectl {shlex.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def demo_pod(name: str, count: int) -> dict[str, Any]:
    pod = vnpu_pod(name, WORK, template="vir05_1c_16g", count=count,
                   spec={"terminationGracePeriodSeconds": 10})  # fmt: skip
    pod["spec"]["containers"] = [
        {"name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
         "command": ["sh", "-c", MAIN]}
    ]  # fmt: skip
    return pod


def pod_ids(plane: LocalPlane, name: str) -> list[int]:
    pod = plane.get_json("pod", name, "-n", WORK)
    allocs = plane.get_json("vnpuallocations", "-n", WORK,
                            "-l", f"{names.LABEL_POD_UID}={pod['metadata']['uid']}")  # fmt: skip
    return sorted(int(a["spec"]["vnpuId"]) for a in allocs["items"])


def ready(plane: LocalPlane, component: str) -> None:
    def check() -> bool:
        pods = plane.get_json("pods", "-n", NAMESPACE,
                              "-l", f"app.kubernetes.io/component={component}")  # fmt: skip
        return any(
            c["type"] == "Ready" and c["status"] == "True"
            for p in pods["items"]
            for c in p.get("status", {}).get("conditions") or []
        )

    wait_for(f"the chart's {component} pod Ready", check, 180, interval=0.5)


def story(plane: LocalPlane, node: RealNode, workdir: Path) -> None:
    banner("the product image", "Built from Dockerfile without Docker (cached by its inputs), "
           "imported into the node's containerd.")  # fmt: skip
    t0 = time.monotonic()
    image = productimage.build(progress=lambda line: print(f"  {line}", flush=True))
    node.import_image(image.archive)
    print(f"  {image.ref} ready in {time.monotonic() - t0:.1f}s", flush=True)

    banner("helm install", "The operator and a simulated-chip agent, on the real node only; "
           "the webhook gives vNPU pods the RuntimeClass of the Ascend runtime.")  # fmt: skip
    node.add_davinci_manager()
    plane.kubectl("label", "node", node.name, f"{names.LABEL_NPU_NODE}=true", "--overwrite")
    # The plane's own policies exempt a local operator; the chart brings its own.
    plane.remove_policies()
    values = real_node_values(
        plane, node, image, runtime_class=RUNTIME_CLASS, chips=CHIPS,
        state_dir=workdir / "agent-state", cdi_dir=workdir / "cdi",
    )  # fmt: skip
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    print(f"$ helm install {RELEASE} charts/vnpu-operator -n {NAMESPACE} --create-namespace "
          f"-f values.yaml", flush=True)  # fmt: skip
    helm_ok(plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
            "-f", str(values_file))  # fmt: skip
    ready(plane, "operator")
    ready(plane, "agent")
    kubectl(plane, "get", "pods", "-n", NAMESPACE, "-o", "wide")

    banner("two pods ask for vNPUs", "train asks for 2, infer for 1, by annotation.")
    plane.kubectl("create", "namespace", WORK)
    t0 = time.monotonic()
    for name, count in (("train", 2), ("infer", 1)):
        plane.apply(demo_pod(name, count))

    def running(name: str) -> bool:
        pod = plane.get_json("pod", name, "-n", WORK) or {}
        return bool(pod.get("status", {}).get("phase") == "Running")

    for name in ("train", "infer"):
        wait_for(f"{name} Running", functools.partial(running, name), 120, interval=0.5)
    print(f"  both Running {time.monotonic() - t0:.1f}s after create", flush=True)
    kubectl(plane, "get", "vnpuallocations", "-n", WORK)

    banner("inside the containers", "Each sees exactly the vNPUs its allocations hold.")
    for name in ("train", "infer"):
        out = kubectl(plane, "exec", "-n", WORK, name, "--", "sh", "-c", SHOW)
        ids = pod_ids(plane, name)
        shown = {line.strip() for line in out.splitlines()}
        wanted = {f"/dev/davinci{i}" for i in ids}
        visible = f"ASCEND_VISIBLE_DEVICES={','.join(str(i) for i in ids)}"
        # davinci_manager, the control device, is in every vNPU container.
        numbered = {d for d in shown if d.startswith("/dev/davinci") and d[12:].isdigit()}
        if visible not in shown or numbered != wanted:
            raise DemoError(f"{name} sees {sorted(shown)}, its allocations hold {ids}")

    banner("delete train", "Its container takes 3 s to stop; its vNPUs stay until it has.")
    ids = pod_ids(plane, "train")
    devices = [node.device_dir / f"vdavinci{i}" for i in ids]
    kubectl(plane, "delete", "pod", "train", "-n", WORK, "--wait=false")
    t0 = time.monotonic()
    time.sleep(1.5)
    if not all(d.exists() for d in devices):
        raise DemoError("train's vNPUs were destroyed while its container was stopping")
    print(f"  1.5 s later the container is stopping and vNPUs {ids} still exist", flush=True)
    wait_for("train's vNPUs destroyed", lambda: not any(d.exists() for d in devices), 60)
    destroyed = time.monotonic() - t0
    wait_for("train gone", lambda: plane.get_json("pod", "train", "-n", WORK) is None, 60)
    print(f"  vNPUs destroyed at {destroyed:.1f}s, pod object gone at "
          f"{time.monotonic() - t0:.1f}s", flush=True)  # fmt: skip

    banner("helm uninstall, in the documented order", "vNPU pods first, then their "
           "allocations gone, then the release.")  # fmt: skip
    kubectl(plane, "delete", "pods", "--all", "-n", WORK, "--wait=false")
    wait_for(
        "allocations gone",
        lambda: not plane.get_json("vnpuallocations", "-A")["items"],
        120,
        interval=0.5,
    )
    wait_for("the vNPU pods gone", lambda: not plane.get_json("pods", "-n", WORK)["items"], 60)
    print(f"$ helm uninstall {RELEASE} -n {NAMESPACE} --wait", flush=True)
    helm_ok(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s")
    wait_for(
        "the release's pods gone",
        lambda: not plane.get_json("pods", "-n", NAMESPACE)["items"],
        120,
        interval=0.5,
    )
    left = sorted(p.name for p in node.device_dir.glob("vdavinci*"))
    if left:
        raise DemoError(f"vNPU device nodes left: {left}")
    kubectl(plane, "get", "pods", "-A")


def main() -> int:
    if os.geteuid() != 0:
        print("make demo-node needs root: it runs a kubelet and containerd on this machine "
              "(make demo needs neither)", file=sys.stderr)  # fmt: skip
        return 2
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="vnpu-demo-node-"))
    plane = LocalPlane(workdir)
    node = RealNode(plane)
    ok = False
    try:
        banner("a local control plane and one real node",
               "etcd, kube-apiserver, controller-manager, scheduler on this machine; a "
               "kubelet with containerd and runc named after it.")  # fmt: skip
        plane.start(progress=lambda m: print(f"  {m}", flush=True))
        node.start(progress=lambda m: print(f"  {m}", flush=True))
        kubectl(plane, "get", "nodes", "-o", "wide")
        story(plane, node, workdir)
        ok = True
    except (DemoError, PlaneError, AssertionError, subprocess.SubprocessError) as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr, flush=True)
    finally:
        node.stop()
        plane.stop()
        if ok:
            plane.rmtree()
        else:
            print(f"\nlogs kept in {workdir}", file=sys.stderr)
    print(f"\ndemo-node {'finished' if ok else 'FAILED'} in {time.monotonic() - t0:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
