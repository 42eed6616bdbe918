#!/usr/bin/env python3
"""A stand-in for `npu-smi` backed by the simulator's state.

Speaks the subset the npu-smi backend uses, in the formats of docs/ASCEND.md
('npu-smi commands and output'):
`info -m`, `info -t template-info [-i card]`, `info -t info-vnpu -i c -c d`,
`info -t health -i c -c d`, `info -t vnpu-cfg-recover`,
`set -t create-vnpu|destroy-vnpu|vnpu-cfg-recover ...`.

Environment:
  NPU_SMI_FAKE_STATE      simulator state file (required; a command makes one
                          or two simulator queries, which count against an
                          injected query failure's `times`)
  NPU_SMI_FAKE_PHYID=1    print the newer `info -m` with a Chip Phy-ID column
  NPU_SMI_FAKE_MALFORMED  comma list of KEY=MODE: KEY is a -t value
                          (info-vnpu, template-info, health, vnpu-cfg-recover,
                          create-vnpu, destroy-vnpu), chip-list for `info -m`,
                          or all; MODE is truncate (first half of the lines),
                          garbage (digits become '?') or empty (nothing, exit 0)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Run with `python -S` for speed: the simulator needs only the standard library.
_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(_ROOT / "node_agent"), str(_ROOT / "operator"), str(_ROOT / "common")]

from vnpu_agent.drivers.base import (  # noqa: E402
    ANY_VNPU_ID,
    ChipInfo,
    DriverError,
    InvalidIdError,
)
from vnpu_agent.drivers.sim import SimDriver  # noqa: E402


class UsageError(Exception):
    pass


def _field(key: str, value: object) -> str:
    return f"        {key:<31}: {value}"


def _option(args: list[str], flag: str) -> str:
    if flag not in args or args.index(flag) + 1 >= len(args):
        raise UsageError(f"Error parameter of {flag}.")
    return args[args.index(flag) + 1]


def _int_option(args: list[str], flag: str) -> int:
    value = _option(args, flag)
    if not value.isdigit():
        raise UsageError(f"Error parameter of {flag}.")
    return int(value)


def _chip(sim: SimDriver, args: list[str]) -> ChipInfo:
    card, device = _int_option(args, "-i"), _int_option(args, "-c")
    for chip in sim.list_chips():
        if (chip.card_id, chip.device_id) == (card, device):
            return chip
    raise UsageError("The device does not exist.")


def chip_list(sim: SimDriver) -> str:
    phy = os.environ.get("NPU_SMI_FAKE_PHYID") == "1"
    names = ["NPU ID", "Chip ID", "Chip Logic ID", *(["Chip Phy-ID"] if phy else []), "Chip Name"]
    lines = ["\t" + "".join(f"{n:<31}" for n in names)]
    for chip in sim.list_chips():
        cells = [chip.card_id, chip.device_id, chip.index, *([chip.physical_id] if phy else [])]
        lines.append("\t" + "".join(f"{c!s:<31}" for c in cells) + f"Ascend {chip.model}")
        mcu = [chip.card_id, chip.device_id + 1, "-", *(["-"] if phy else [])]
        lines.append("\t" + "".join(f"{c!s:<31}" for c in mcu) + "Mcu")
    return "\n".join(lines)


def template_info(sim: SimDriver, args: list[str]) -> str:
    chips = sim.list_chips()
    card = _int_option(args, "-i") if "-i" in args else chips[0].card_id
    chip = next((c for c in chips if c.card_id == card), None)
    if chip is None:
        raise UsageError("The device does not exist.")
    rule = "+" + "-" * 90 + "+"
    lines = [
        rule,
        f"|{'NPU instance template info is:':<90}|",
        f"|{'Name':<19} {'AICORE':<9} {'Memory':<9} {'AICPU':<9} {'VPC':<14} {'VENC':<14} "
        f"{'JPEGD':<10}|",
        f"|{'':<31}GB{'':<17}{'PNGD':<15}{'VDEC':<15}{'JPEGE':<10}|",
        "|" + "=" * 90 + "|",
    ]
    for t in sim.list_templates(chip.index):
        # VPC is the media unit; the other DVPP engines scale with it.
        lines.append(
            f"|{t.name:<19} {t.aicore:<9} {t.memory_mb // 1024:<9} {t.aicpu:<9g} {t.media:<14} "
            f"{0:<14} {3 * t.media:<10}|"
        )
        lines.append(f"|{'':<50}{0:<14} {t.media // 4:<14} {t.media // 2:<10}|")
        lines.append(rule)
    return "\n".join(lines)


def info_vnpu(sim: SimDriver, args: list[str]) -> str:
    info = _chip(sim, args)
    vnpus = sim.list_vnpus(info.index)
    rule = "+" + "-" * 79 + "+"
    used_media = info.media_total - info.media_free

    def frac(free: int, total: int, width: int) -> str:
        return f"{free}/{total}".ljust(width)

    resource = (
        "| "
        + frac(info.aicore_free, info.aicore_total, 10)
        + frac(info.memory_free_mb // 1024, info.memory_total_mb // 1024, 10)
        + frac(info.aicpu_free, info.aicpu_total, 9)
        + frac(info.media_free, info.media_total, 7)
        + frac(0, 0, 8)
        + frac(info.media_total // 4 - used_media // 4, info.media_total // 4, 8)
        + frac(3 * info.media_free, 3 * info.media_total, 9)
        + frac(info.media_free // 2, info.media_total // 2, 9)
        + "NA/NA".ljust(8)
        + "|"
    )
    lines = [
        rule,
        f"| {'NPU resource static info as follow:':<78}|",
        f"| {'Format:Free/Total                   NA: Currently, query is not supported.':<78}|",
        f"| {'AICORE    Memory    AICPU    VPC    VENC    VDEC    JPEGD    JPEGE    PNGD':<78}|",
        f"| {'           GB':<78}|",
        "|" + "=" * 79 + "|",
        resource,
        rule,
        f"| {f'Total number of vnpu: {len(vnpus)}':<78}|",
        rule,
        "|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |",
        rule,
    ]
    for v in vnpus:
        container = "ffffffffffff" if v.in_use else "000000000000"
        lines.append(
            f"|  {v.id:<9}|  {0:<14}|  {container:<14}|  {int(v.in_use):<8}|  {v.template:<20}|"
        )
        lines.append(rule)
    return "\n".join(lines)


def health(sim: SimDriver, args: list[str]) -> str:
    chip = _chip(sim, args)
    return "\n".join(
        [
            _field("Health Status", "OK" if chip.healthy else "Critical"),
            _field("Error Code", "NA" if chip.healthy else "80E18005"),
            _field("Error Information", "NA" if chip.healthy else "Node type=..., fault"),
        ]
    )


def create(sim: SimDriver, args: list[str]) -> str:
    chip = _chip(sim, args)
    template = _option(args, "-f")
    vnpu_id = _int_option(args, "-v") if "-v" in args else ANY_VNPU_ID
    try:
        sim.create_vnpu(chip.index, template, vnpu_id)
    except InvalidIdError as exc:
        if exc.driver_message.endswith("already exist"):
            raise
        raise UsageError("Error parameter of -v.") from exc
    return "\n".join([_field("Status", "OK"), _field("Message", "Create vnpu success")])


def destroy(sim: SimDriver, args: list[str]) -> str:
    chip = _chip(sim, args)
    vnpu_id = _int_option(args, "-v")
    try:
        sim.destroy_vnpu(chip.index, vnpu_id)
    except DriverError as exc:
        raise UsageError(f"destroy vnpu {vnpu_id} failed. Error code: {exc.code}.") from exc
    return "\n".join([_field("Status", "OK"), _field("Message", f"Destroy vnpu {vnpu_id} success")])


def recover(sim: SimDriver, args: list[str], setting: bool) -> str:
    if not setting:
        mode = "Enable" if sim.config_recover_enabled() else "Disable"
        return _field("VNPU config recover mode", mode)
    value = _option(args, "-d")
    if value not in ("0", "1"):
        raise UsageError("Error parameter of -d.")
    sim.set_config_recover(value == "1")
    word = "Enable" if value == "1" else "Disable"
    message = f"The VNPU config recover mode {word} is set successfully."
    return "\n".join([_field("Status", "OK"), _field("Message", message)])


def dispatch(sim: SimDriver, args: list[str]) -> tuple[str, str]:
    if args[:2] == ["info", "-m"]:
        return "chip-list", chip_list(sim)
    if len(args) < 3 or args[1] != "-t":
        raise UsageError("UsageError: npu-smi info|set -t TYPE ...")
    kind = args[2]
    handlers = {
        ("info", "template-info"): lambda: template_info(sim, args),
        ("info", "info-vnpu"): lambda: info_vnpu(sim, args),
        ("info", "health"): lambda: health(sim, args),
        ("info", "vnpu-cfg-recover"): lambda: recover(sim, args, setting=False),
        ("set", "vnpu-cfg-recover"): lambda: recover(sim, args, setting=True),
        ("set", "create-vnpu"): lambda: create(sim, args),
        ("set", "destroy-vnpu"): lambda: destroy(sim, args),
    }
    handler = handlers.get((args[0], kind))
    if handler is None:
        raise UsageError(f"Unsupported command: {' '.join(args)}")
    return kind, handler()


def mangle(key: str, text: str) -> str | None:
    modes = dict(
        item.split("=", 1)
        for item in os.environ.get("NPU_SMI_FAKE_MALFORMED", "").split(",")
        if "=" in item
    )
    mode = modes.get(key) or modes.get("all")
    if mode == "truncate":
        lines = text.splitlines()
        return "\n".join(lines[: len(lines) // 2])
    if mode == "garbage":
        return "".join("?" if ch.isdigit() else ch for ch in text)
    if mode == "empty":
        return ""
    return None


def main(argv: list[str]) -> int:
    try:
        sim = SimDriver(os.environ["NPU_SMI_FAKE_STATE"])
        key, text = dispatch(sim, argv)
    except UsageError as exc:
        print(_field("Status", "FAILED"))
        print(_field("Message", exc))
        return 1
    except DriverError as exc:
        verb = argv[2].replace("-vnpu", "").capitalize() if len(argv) > 2 else "Query"
        print(_field("Status", "FAILED"))
        print(_field("Message", f"{verb} vnpu failed. Error code: {exc.code}."))
        return 1
    mangled = mangle(key, text)
    print(text if mangled is None else mangled)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
