"""Command line of the local control plane.

python -m localplane up [--dir .localplane] [--crds crds/]
python -m localplane add-node NAME [--chips 910B3=4,310P3=2] [--label k=v]
python -m localplane down [--dir .localplane]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localplane.nodes import NodeSpec, parse_chips
from localplane.plane import REPO_ROOT, LocalPlane, PlaneError, PlaneState

DEFAULT_DIR = REPO_ROOT / ".localplane"


def _say(msg: str) -> None:
    print(f"[localplane] {msg}", file=sys.stderr, flush=True)


def _attach(workdir: Path) -> LocalPlane:
    """A handle on a running detached plane (for kubectl and node helpers)."""
    state = PlaneState.load(workdir)
    plane = LocalPlane(workdir, attached=False)
    plane.ports = state.ports
    return plane


def cmd_up(args: argparse.Namespace) -> int:
    workdir: Path = args.dir
    if (workdir / "state.json").exists():
        plane = _attach(workdir)
        if plane.kubectl("get", "--raw", "/readyz", check=False).returncode == 0:
            _say("already running")
            print(f"export KUBECONFIG={plane.kubeconfig}")
            return 0
        LocalPlane.stop_detached(workdir)
    plane = LocalPlane(workdir, attached=False)
    plane.rmtree()
    plane.start(progress=_say)
    for crd_dir in args.crds:
        plane.install_crds(crd_dir)
        _say(f"applied CRDs from {crd_dir}")
    print(f"export KUBECONFIG={plane.kubeconfig}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if LocalPlane.stop_detached(args.dir):
        _say("stopped")
    else:
        _say(f"no plane running in {args.dir}")
    return 0


def cmd_add_node(args: argparse.Namespace) -> int:
    plane = _attach(args.dir)
    labels = dict(kv.split("=", 1) for kv in args.label)
    plane.add_nodes([NodeSpec(name=args.name, chips=parse_chips(args.chips), labels=labels)])
    _say(f"node {args.name} ready")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localplane", description=__doc__)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the plane (detached) and print KUBECONFIG")
    up.add_argument("--crds", type=Path, action="append", default=[], help="CRD dir to apply")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop the plane")
    down.set_defaults(func=cmd_down)
    node = sub.add_parser("add-node", help="create a kwok node with simulated chips")
    node.add_argument("name")
    node.add_argument("--chips", default="", help="e.g. 910B3=4,310P3=2")
    node.add_argument("--label", action="append", default=[], help="k=v")
    node.set_defaults(func=cmd_add_node)
    args = parser.parse_args(argv)
    try:
        rc: int = args.func(args)
    except (PlaneError, ValueError) as exc:
        _say(f"error: {exc}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
