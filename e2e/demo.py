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

from localplane import LocalPlane, NodeSpec  # noqa: E402
from vnpu_operator import names  # noqa: E402


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
        banner("allocations (none yet: the operator and agents arrive with the next issues)")
        show(plane, "get", "vnpuallocations", "-A")
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
