"""Command line of the simulator: `python -m vnpu_agent.drivers.sim --state F CMD`.

Prints JSON on stdout; on failure prints {"error": {...}} and exits 1.

    init --chips 910B3=4,310P3=2     create the state (no-op if it matches)
    show                             chips, vNPUs, faults, config-recover lines
    create CHIP TEMPLATE [--id N]    as the agent would
    destroy CHIP ID
    open ID / release ID             a container opens / releases the vNPU
    reboot                           power cycle, replaying vnpu.cfg if enabled
    recover on|off                   config-recover mode
    inject fail OP [--code C] [--times N] [--after] [--message TEXT]
    inject slow OP SECONDS           OP: create, destroy, query
    inject unhealthy CHIP / inject healthy CHIP
    inject stuck ID / inject vanish ID
    clear-faults
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from vnpu_agent.drivers.base import ANY_VNPU_ID, DriverError
from vnpu_agent.drivers.sim.engine import SimDriver
from vnpu_agent.drivers.sim.state import OPS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vnpu_agent.drivers.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--state", required=True, help="simulator state file")
    p.add_argument("--recover-file", help="config-recover file (default: vnpu.cfg beside --state)")
    sub = p.add_subparsers(dest="cmd", required=True)
    init = sub.add_parser("init")
    init.add_argument("--chips", required=True, help="layout, e.g. 910B3=4,310P3=2")
    sub.add_parser("show")
    create = sub.add_parser("create")
    create.add_argument("chip", type=int)
    create.add_argument("template")
    create.add_argument("--id", type=int, default=ANY_VNPU_ID)
    destroy = sub.add_parser("destroy")
    destroy.add_argument("chip", type=int)
    destroy.add_argument("id", type=int)
    for name in ("open", "release"):
        sub.add_parser(name).add_argument("id", type=int)
    sub.add_parser("reboot")
    sub.add_parser("recover").add_argument("mode", choices=["on", "off"])
    sub.add_parser("clear-faults")
    inject = sub.add_parser("inject").add_subparsers(dest="fault", required=True)
    fail = inject.add_parser("fail")
    fail.add_argument("op", choices=OPS)
    fail.add_argument("--code", type=int, default=-8005)
    fail.add_argument("--times", type=int)
    fail.add_argument("--after", action="store_true")
    fail.add_argument("--message", default="")
    slow = inject.add_parser("slow")
    slow.add_argument("op", choices=OPS)
    slow.add_argument("seconds", type=float)
    for name in ("unhealthy", "healthy"):
        inject.add_parser(name).add_argument("chip", type=int)
    for name in ("stuck", "vanish"):
        inject.add_parser(name).add_argument("id", type=int)
    return p


def _run(args: argparse.Namespace) -> Any:
    if args.cmd == "init":
        return SimDriver(args.state, args.chips, recover_path=args.recover_file).snapshot()
    sim = SimDriver(args.state, recover_path=args.recover_file)
    result: Any = None
    if args.cmd == "create":
        result = asdict(sim.create_vnpu(args.chip, args.template, args.id))
    elif args.cmd == "destroy":
        sim.destroy_vnpu(args.chip, args.id)
    elif args.cmd == "open":
        result = asdict(sim.open_vnpu(args.id))
    elif args.cmd == "release":
        result = asdict(sim.release_vnpu(args.id))
    elif args.cmd == "reboot":
        result = asdict(sim.reboot())
    elif args.cmd == "recover":
        sim.set_config_recover(args.mode == "on")
    elif args.cmd == "clear-faults":
        sim.clear_faults()
    elif args.cmd == "inject":
        _inject(sim, args)
    return result if result is not None else sim.snapshot()


def _inject(sim: SimDriver, args: argparse.Namespace) -> None:
    if args.fault == "fail":
        sim.inject_failure(
            args.op, args.code, times=args.times, after=args.after, message=args.message
        )
    elif args.fault == "slow":
        sim.inject_slow(args.op, args.seconds)
    elif args.fault in ("unhealthy", "healthy"):
        sim.set_chip_health(args.chip, args.fault == "healthy")
    elif args.fault == "stuck":
        sim.mark_stuck(args.id)
    elif args.fault == "vanish":
        sim.mark_vanished(args.id)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = _run(args)
    except DriverError as exc:
        error = {
            "type": type(exc).__name__,
            "reason": exc.reason,
            "code": exc.code,
            "message": str(exc),
        }
        print(json.dumps({"error": error}, indent=1))
        return 1
    print(json.dumps(result, indent=1))
    return 0
