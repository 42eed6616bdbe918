"""Pure parsers of npu-smi output. Each raises MalformedOutputError (with the
text as `driver_message`) on anything it cannot read with confidence: a
wrong number is worse than an error.

Formats (samples in docs/ASCEND.md, 'npu-smi commands and output', and the tests):

`npu-smi info -m`: a chip table. Rows are NPU ID (card, `-i`), Chip ID
(`-c`), Chip Logic ID (our chip index; `-` for the MCU, skipped) and Chip
Name ("Ascend 910B3"); newer npu-smi versions add a "Chip Phy-ID" column
before the name, which we use when present::

        NPU ID      Chip ID     Chip Logic ID     Chip Name
        0           0           0                 Ascend 910B3
        0           1           -                 Mcu

`info -t template-info [-i card]`: two lines per template, the second
carrying the PNGD / VDEC / JPEGE columns; `info -t info-vnpu -i c -c d`:
Free/Total resources, the vNPU count, then one row per vNPU;
`info -t health -i c -c d`: "Health Status : OK"; `info -t vnpu-cfg-recover`:
"VNPU config recover mode : Enable"; `set -t ...`: "Status : OK" and
"Message : ...". A failed command exits non-zero or prints a Status other
than OK; any DCMI code (-8xxx) in its text is taken as the driver code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from vnpu_agent.drivers.base import MalformedOutputError, TemplateSpec

_TEMPLATE_NAME = re.compile(r"^vir\d{2}(_[0-9a-z]+)*$")
_FRACTION = re.compile(r"^(NA|\d+(?:\.\d+)?)/(NA|\d+(?:\.\d+)?)$")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
_DCMI_CODE = re.compile(r"(?<![\w.])(-8\d{3})(?!\d)")
_VNPU_COUNT = re.compile(r"Total number of vnpu\s*:\s*(\S+)", re.IGNORECASE)
# npu-smi's words for a chip that can run work; Alarm, Critical and the rest cannot.
HEALTHY_STATES = frozenset({"OK", "WARNING"})


def _bad(what: str, text: str) -> MalformedOutputError:
    return MalformedOutputError(f"cannot parse npu-smi output: {what}", driver_message=text)


def _cells(line: str) -> list[str]:
    """Whitespace-separated words of a `|...|` table line."""
    return line.strip().strip("|").split()


def _columns(line: str) -> list[str]:
    """`|`-separated cells of a table line."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def find_error_code(text: str) -> int | None:
    match = _DCMI_CODE.search(text)
    return int(match.group(1)) if match else None


# ----------------------------------------------------------------- chip list


@dataclass(frozen=True)
class ChipEntry:
    card_id: int
    device_id: int
    logic_id: int
    physical_id: int | None  # only when npu-smi prints a Chip Phy-ID column
    name: str


def parse_chip_list(text: str) -> list[ChipEntry]:
    lines = text.splitlines()
    header = next((i for i, ln in enumerate(lines) if "NPU ID" in ln and "Chip Name" in ln), None)
    if header is None:
        raise _bad("no 'NPU ID ... Chip Name' header in the chip list", text)
    has_phy = "Phy-ID" in lines[header] or "Phy ID" in lines[header]
    numeric = 4 if has_phy else 3
    chips: list[ChipEntry] = []
    for line in lines[header + 1 :]:
        words = line.split()
        if not words:
            continue
        if len(words) < numeric + 1:
            raise _bad(f"chip row {line.strip()!r} has too few columns", text)
        card, device, logic = words[0], words[1], words[2]
        if logic == "-":
            continue  # the card's MCU, not a chip
        numbers = words[:numeric]
        if not all(w.isdigit() for w in numbers):
            raise _bad(f"chip row {line.strip()!r} has a non-numeric id", text)
        chips.append(
            ChipEntry(
                card_id=int(card),
                device_id=int(device),
                logic_id=int(logic),
                physical_id=int(words[3]) if has_phy else None,
                name=" ".join(words[numeric:]),
            )
        )
    if len({c.logic_id for c in chips}) != len(chips):
        raise _bad("two chips share a logic id", text)
    return chips


# ------------------------------------------------------------- template info


def parse_template_info(text: str) -> list[TemplateSpec]:
    lines = [ln.strip() for ln in text.splitlines()]
    header = next((i for i, ln in enumerate(lines) if _cells(ln)[:2] == ["Name", "AICORE"]), None)
    if header is None or header + 1 >= len(lines):
        raise _bad("no 'Name AICORE ...' header in the template list", text)
    first = _cells(lines[header])
    second = [w for w in _cells(lines[header + 1]) if w != "GB"]
    for needed in ("AICORE", "Memory", "AICPU", "VPC"):
        if needed not in first:
            raise _bad(f"template list has no {needed} column", text)
    rows = [ln for ln in lines[header + 2 :] if ln.startswith("|") and not set(ln) <= set("|=")]
    templates: list[TemplateSpec] = []
    i = 0
    while i < len(rows):
        words = _cells(rows[i])
        if not words or not _TEMPLATE_NAME.match(words[0]):
            raise _bad(f"unexpected line {rows[i]!r} in the template list", text)
        if len(words) != len(first) or i + 1 >= len(rows):
            raise _bad(f"template row {rows[i]!r} is incomplete", text)
        more = _cells(rows[i + 1])
        if len(more) != len(second) or not all(_NUMBER.match(w) for w in words[1:] + more):
            raise _bad(f"template {words[0]} has a bad or missing value", text)
        values = dict(zip(first[1:], (float(w) for w in words[1:]), strict=True))
        templates.append(
            TemplateSpec(
                name=words[0],
                aicore=int(values["AICORE"]),
                memory_mb=int(values["Memory"] * 1024),
                # AICPU prints with %g and may be fractional; round up so
                # that placement never counts on a share it does not have.
                aicpu=math.ceil(values["AICPU"]),
                media=int(values["VPC"]),
            )
        )
        i += 2
    if not templates:
        raise _bad("the template list is empty", text)
    _require_closed(lines, text)
    return templates


def _require_closed(lines: list[str], text: str) -> None:
    """npu-smi closes its tables with a +---+ rule; output that stops short
    of one was cut off."""
    last = next((ln for ln in reversed(lines) if ln), "")
    if not (last.startswith("+") and last.endswith("+") and set(last) <= set("+-")):
        raise _bad("the table is not closed (output cut off?)", text)


# ------------------------------------------------------------------ info-vnpu


@dataclass(frozen=True)
class VnpuRow:
    id: int
    vgroup: str
    container_id: str
    in_use: bool
    template: str


@dataclass(frozen=True)
class VnpuTable:
    # Column name -> (free, total); None where npu-smi prints NA.
    resources: dict[str, tuple[float | None, float | None]]
    vnpus: list[VnpuRow]

    def free_total(self, column: str) -> tuple[int, int]:
        """Whole units; a column that is missing or NA reads 0/0."""
        free, total = self.resources.get(column, (None, None))
        return math.floor(free or 0), math.floor(total or 0)


def _fraction(word: str) -> tuple[float | None, float | None]:
    match = _FRACTION.match(word)
    assert match is not None  # checked by the caller
    free, total = match.groups()
    return (None if free == "NA" else float(free)), (None if total == "NA" else float(total))


def parse_info_vnpu(text: str) -> VnpuTable:
    lines = [ln.strip() for ln in text.splitlines()]
    header = next((i for i, ln in enumerate(lines) if _cells(ln)[:1] == ["AICORE"]), None)
    if header is None:
        raise _bad("no 'AICORE Memory AICPU ...' header in the vNPU info", text)
    names = _cells(lines[header])
    values = next(
        (
            _cells(ln)
            for ln in lines[header + 1 :]
            if ln.startswith("|") and _cells(ln) and all(_FRACTION.match(w) for w in _cells(ln))
        ),
        None,
    )
    if values is None or len(values) != len(names):
        raise _bad("the Free/Total resource row is missing or incomplete", text)
    resources = {n: _fraction(w) for n, w in zip(names, values, strict=True)}
    for needed in ("AICORE", "Memory", "AICPU"):
        if needed not in resources:
            raise _bad(f"vNPU info has no {needed} column", text)
    count_match = _VNPU_COUNT.search(text)
    if count_match is None or not count_match.group(1).isdigit():
        raise _bad("no 'Total number of vnpu: N' line", text)
    count = int(count_match.group(1))
    rows = _vnpu_rows(lines, text)
    if len(rows) != count:
        raise _bad(f"the vNPU table has {len(rows)} rows but says there are {count}", text)
    _require_closed(lines, text)
    return VnpuTable(resources=resources, vnpus=rows)


def _vnpu_rows(lines: list[str], text: str) -> list[VnpuRow]:
    header = next((i for i, ln in enumerate(lines) if "Vnpu ID" in ln and "|" in ln), None)
    if header is None:
        return []
    names = _columns(lines[header])
    try:
        at = {key: names.index(key) for key in ("Vnpu ID", "Status", "Template Name")}
    except ValueError:
        raise _bad("the vNPU table header lacks Vnpu ID, Status or Template Name", text) from None
    rows: list[VnpuRow] = []
    for line in lines[header + 1 :]:
        if not line.startswith("|"):
            continue
        cells = _columns(line)
        if len(cells) != len(names):
            raise _bad(f"vNPU row {line!r} has {len(cells)} cells, not {len(names)}", text)
        vid, status, template = (
            cells[at["Vnpu ID"]],
            cells[at["Status"]],
            cells[at["Template Name"]],
        )
        if (
            not vid.isdigit()
            or status not in ("0", "1", "NA")
            or not _TEMPLATE_NAME.match(template)
        ):
            raise _bad(f"vNPU row {line!r} has a bad id, status or template", text)
        rows.append(
            VnpuRow(
                id=int(vid),
                vgroup=_cell(cells, names, "Vgroup ID"),
                container_id=_cell(cells, names, "Container ID"),
                # NA: the driver cannot tell; count it as in use so that
                # nobody destroys or reclaims it on a guess.
                in_use=status != "0",
                template=template,
            )
        )
    return rows


def _cell(cells: list[str], names: list[str], name: str) -> str:
    return cells[names.index(name)] if name in names else ""


# ---------------------------------------------------------- key : value forms


def parse_fields(text: str) -> dict[str, str]:
    """'Key : Value' lines -> {"key": "Value"}, keys lowercased with single spaces."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields.setdefault(" ".join(key.split()).lower(), value.strip())
    return fields


def parse_status(text: str) -> tuple[bool | None, str]:
    """(True if Status is OK, False if another status, None if there is no
    Status line; the Message, or the whole text when there is none)."""
    fields = parse_fields(text)
    status = fields.get("status")
    message = fields.get("message") or text.strip()
    if status is None:
        return None, message
    return status.upper() == "OK", message


def parse_recover_mode(text: str) -> bool:
    value = parse_fields(text).get("vnpu config recover mode", "").lower()
    if value in ("enable", "enabled"):
        return True
    if value in ("disable", "disabled"):
        return False
    raise _bad("no 'VNPU config recover mode : Enable|Disable' line", text)


def parse_health(text: str) -> bool:
    fields = parse_fields(text)
    value = fields.get("health status") or fields.get("healthy") or fields.get("health")
    if not value:
        raise _bad("no 'Health Status : ...' line", text)
    return value.upper() in HEALTHY_STATES
