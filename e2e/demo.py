"""`make demo`: the whole story on a local control plane.

Brings up the plane (etcd, kube-apiserver, controller-manager, scheduler,
kwok), installs the CRDs, creates kwok nodes with simulated chips and shows
what `kubectl` shows. Everything is stopped at the end; pass `--keep` to
leave the plane running (the KUBECONFIG to export is printed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("operator", "node_agent", "hack"):
    sys.path.insert(0, str(ROOT / sub))

sys.path.insert(0, str(ROOT / "tests" / "integration"))

import json  # noqa: E402
import signal  # noqa: E402

import yaml  # noqa: E402
from agent_harness import AgentProcess, allocation, vnpu_ids, wait_for  # noqa: E402

from localplane import LocalPlane, NodeSpec  # noqa: E402
from vnpu_operator import names  # noqa: E402


def start_agent(plane: LocalPlane, workdir: Path, nodes: list[str]) -> AgentProcess:
    if plane.kubectl("get", "namespace", "vnpu-system", check=False).returncode != 0:
        plane.kubectl("create", "namespace", "vnpu-system")
    agent_dir = workdir / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    return AgentProcess(plane, agent_dir, nodes).start()


def settled(plane: LocalPlane, n: int) -> bool:
    items = json.loads(plane.kubectl("get", "vnpuallocations", "-A", "-o", "json").stdout)["items"]
    return len(items) == n and all(i.get("status", {}).get("phase") for i in items)


def vnpu_count(plane: LocalPlane) -> int:
    items = json.loads(plane.kubectl("get", "vnpunodes", "-o", "json").stdout)["items"]
    return sum(i.get("status", {}).get("vnpuCount", 0) for i in items)


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def show(plane: LocalPlane, *args: str) -> None:
    print(f"$ kubectl {' '.join(args)}", flush=True)
    print(plane.kubectl(*args).stdout.rstrip(), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the plane running")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="vnpu-demo-")) if not args.keep else ROOT / ".localplane"
    plane = LocalPlane(workdir, attached=not args.keep)
    t0 = time.monotonic()
    banner("starting a local control plane (real etcd, kube-apiserver, scheduler, kwok)")
    plane.start(progress=lambda m: print(f"  {m}", flush=True))
    try:
        banner("installing the CRDs generated from the API models")
        plane.install_crds()
        show(
            plane,
            "get",
            "crd",
            "-l",
            "",
            "-o",
            "custom-columns=NAME:.metadata.name,SHORT:.spec.names.shortNames,SCOPE:.spec.scope",
        )
        banner("creating kwok nodes with simulated NPU chips")
        plane.add_nodes(
            [
                NodeSpec(name="npu-910b-1", chips={"910B3": 4}),
                NodeSpec(name="npu-910b-2", chips={"910B3": 4}),
                NodeSpec(name="npu-310p-1", chips={"310P3": 2}),
            ]
        )
        show(plane, "get", "nodes", "-L", names.LABEL_NPU_NODE)
        banner("starting one vnpu-agent process serving the three simulated nodes")
        agent = start_agent(plane, workdir, ["npu-910b-1", "npu-910b-2", "npu-310p-1"])
        try:
            banner("declaring allocations as the operator will (pod UID, node, chip, template, id)")
            allocs = [
                ("train-a", "npu-910b-1", 0, "vir10_3c_32g", 100),
                ("train-b", "npu-910b-1", 0, "vir05_1c_16g", 101),
                ("infer-a", "npu-310p-1", 1, "vir02", 116),
                ("wrong-model", "npu-910b-2", 0, "vir01", 100),
            ]
            plane.kubectl("create", "namespace", "demo")
            for name, node, chip, template, vnpu_id in allocs:
                plane.kubectl(
                    "create",
                    "-n",
                    "demo",
                    "-f",
                    "-",
                    input=yaml.safe_dump(
                        allocation(
                            name,
                            node=node,
                            vnpu_id=vnpu_id,
                            template=template,
                            chip=chip,
                            pod=name,
                            pod_uid=f"uid-{name}",
                        )
                    ),
                )
            wait_for("allocations settled", lambda: settled(plane, len(allocs)), timeout=60)
            time.sleep(1)
            show(plane, "get", "vnpuallocations", "-A")
            show(
                plane,
                "get",
                "vnpuallocations",
                "-n",
                "demo",
                "wrong-model",
                "-o",
                "custom-columns=NAME:.metadata.name,MESSAGE:.status.message",
            )
            wait_for("inventory", lambda: vnpu_count(plane) == 3, timeout=30)
            show(plane, "get", "vnpunodes")
            banner("releasing: deleting the allocations destroys every vNPU")
            plane.kubectl(
                "delete", "vnpuallocations", "--all", "-n", "demo", "--wait=true", timeout=120
            )
            show(plane, "get", "vnpuallocations", "-A")
            wait_for("inventory empty", lambda: vnpu_count(plane) == 0, timeout=30)
            show(plane, "get", "vnpunodes")
            left = sum(len(vnpu_ids(agent.sim(n))) for n in agent.nodes)
            print(f"vNPUs left on the simulated chips: {left}")
        finally:
            agent.kill(signal.SIGTERM)
        print(f"\ndemo finished in {time.monotonic() - t0:.1f}s")
        if args.keep:
            print(
                f"plane left running; export KUBECONFIG={plane.kubeconfig}; stop: make cluster-down"
            )
    finally:
        if not args.keep:
            plane.stop()
            plane.rmtree()
    return 0


if __name__ == "__main__":
    sys.exit(main())
