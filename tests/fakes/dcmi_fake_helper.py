#!/usr/bin/env python3
"""What libdcmi_fake.c runs for every stateful DCMI call, so that the C
stand-in is backed by the same simulator state as everything else.

Usage: dcmi_fake_helper.py OP [ARGS...] with the state file in
VNPU_FAKE_DCMI_STATE. Prints "rc N" (0 or the DCMI code) and then
"key value" lines:

  topology                    chip LOGIC CARD DEVICE PHY AICORE MODEL  (per chip)
  health LOGIC                health 0|3
  total LOGIC / free LOGIC    aicore N, memory MB, aicpu N, media N, vdev ID (total only, per vNPU)
  vdev LOGIC ID               name TEMPLATE, used 0|1, aicore N, memory MB, aicpu N, media N
  create LOGIC TEMPLATE ID    id N
  destroy LOGIC ID
  getrecover / setrecover 0|1 mode 0|1
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Run with `python -S` for speed: the simulator needs only the standard library.
_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(_ROOT / "node_agent"), str(_ROOT / "operator"), str(_ROOT / "common")]

from vnpu_agent.drivers.base import DCMI_INNER_ERR, DCMI_INVALID_PARAMETER, DriverError  # noqa: E402
from vnpu_agent.drivers.sim import SimDriver  # noqa: E402


def run(sim: SimDriver, op: str, args: list[str]) -> list[str]:
    if op == "topology":
        return [
            f"chip {c.index} {c.card_id} {c.device_id} {c.physical_id} {c.aicore_total} {c.model}"
            for c in sim.list_chips()
        ]
    if op == "getrecover":
        return [f"mode {int(sim.config_recover_enabled())}"]
    if op == "setrecover":
        sim.set_config_recover(args[0] == "1")
        return []
    chip = int(args[0])
    if op == "health":
        info = sim.list_chips()[chip]
        return [f"health {0 if info.healthy else 3}"]
    if op in ("total", "free"):
        info = sim.list_chips()[chip]
        if op == "total":
            values = [info.aicore_total, info.memory_total_mb, info.aicpu_total, info.media_total]
        else:
            values = [info.aicore_free, info.memory_free_mb, info.aicpu_free, info.media_free]
        lines = [
            f"{k} {v}" for k, v in zip(("aicore", "memory", "aicpu", "media"), values, strict=True)
        ]
        if op == "total":
            # Listed from the raw state: a vanished vNPU is still in the
            # driver's table; only querying it fails.
            ids = [v["id"] for v in sim.snapshot()["vnpus"] if v["chip"] == chip]
            lines += [f"vdev {i}" for i in ids]
        return lines
    if op == "vdev":
        vnpu = sim.query_vnpu(int(args[1]))
        spec = next(t for t in sim.list_templates(chip) if t.name == vnpu.template)
        return [
            f"name {vnpu.template}",
            f"used {int(vnpu.in_use)}",
            f"aicore {spec.aicore}",
            f"memory {spec.memory_mb}",
            f"aicpu {spec.aicpu}",
            f"media {spec.media}",
        ]
    if op == "create":
        vnpu = sim.create_vnpu(chip, args[1], int(args[2]))
        return [f"id {vnpu.id}"]
    if op == "destroy":
        sim.destroy_vnpu(chip, int(args[1]))
        return []
    raise ValueError(op)


def main(argv: list[str]) -> int:
    try:
        sim = SimDriver(os.environ["VNPU_FAKE_DCMI_STATE"])
        lines = run(sim, argv[0], argv[1:])
    except DriverError as exc:
        print(f"rc {exc.code if exc.code is not None else DCMI_INNER_ERR}")
        print(f"msg {exc}")
        return 0
    except (IndexError, ValueError, KeyError) as exc:
        print(f"rc {DCMI_INVALID_PARAMETER}")
        print(f"msg bad helper call {argv!r}: {exc!r}")
        return 0
    print("rc 0")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
