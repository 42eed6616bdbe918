"""npu-smi output parsers on the documented samples and on broken text."""

from __future__ import annotations

import pytest

from vnpu_agent.drivers.base import MalformedOutputError, TemplateSpec
from vnpu_agent.drivers.npu_smi_parse import (
    ChipEntry,
    find_error_code,
    parse_chip_list,
    parse_fields,
    parse_health,
    parse_info_vnpu,
    parse_recover_mode,
    parse_status,
    parse_template_info,
)

# The 910B4 sample of docs/ASCEND.md, 'npu-smi commands and output', verbatim.
TEMPLATE_INFO = """\
+------------------------------------------------------------------------------------------+
|NPU instance template info is:                                                            |
|Name                AICORE    Memory    AICPU     VPC            VENC           JPEGD     |
|                               GB                 PNGD           VDEC           JPEGE     |
|==========================================================================================|
|vir10_3c_16g        10        16        3         4              0              12        |
|                                                  0              1              2         |
+------------------------------------------------------------------------------------------+
|vir05_1c_8g         5         8         1         2              0              6         |
|                                                  0              0              1         |
+------------------------------------------------------------------------------------------+
"""

INFO_VNPU = """\
+-------------------------------------------------------------------------------+
| NPU resource static info as follow:                                           |
| Format:Free/Total                   NA: Currently, query is not supported.    |
| AICORE    Memory    AICPU    VPC    VENC    VDEC    JPEGD    JPEGE    PNGD    |
|            GB                                                                 |
|===============================================================================|
| 0/20      0/32      1/7      1/9    0/0     0/2     0/24     0/4      NA/NA   |
+-------------------------------------------------------------------------------+
| Total number of vnpu: 2                                                       |
+-------------------------------------------------------------------------------+
|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |
+-------------------------------------------------------------------------------+
|  100      |  0             |  ffffffffffff  |  1       |  vir10_3c_16g        |
+-------------------------------------------------------------------------------+
|  101      |  1             |  000000000000  |  0       |  vir10_3c_16g        |
+-------------------------------------------------------------------------------+
"""

INFO_VNPU_EMPTY = """\
+-------------------------------------------------------------------------------+
| NPU resource static info as follow:                                           |
| Format:Free/Total                   NA: Currently, query is not supported.    |
| AICORE    Memory    AICPU    VPC    VENC    VDEC    JPEGD    JPEGE    PNGD    |
|            GB                                                                 |
|===============================================================================|
| 20/20     64/64     7/7      9/9    0/0     2/2     24/24    4/4      NA/NA   |
+-------------------------------------------------------------------------------+
| Total number of vnpu: 0                                                       |
+-------------------------------------------------------------------------------+
"""

# `npu-smi info -m` on an 8-card 910B3 host (first rows), tab-indented.
CHIP_LIST = (
    "\tNPU ID                         Chip ID                        Chip Logic ID"
    "                  Chip Name                     \n"
    "\t0                              0                              0"
    "                              Ascend 910B3\n"
    "\t0                              1                              -"
    "                              Mcu                           \n"
    "\t1                              0                              1"
    "                              Ascend 910B3\n"
    "\t1                              1                              -"
    "                              Mcu                           \n"
)

CHIP_LIST_WITH_PHY = """\
NPU ID Chip ID Chip Logic ID Chip Phy-ID Chip Name
0 0 0 4 Ascend 310P3
0 1 1 5 Ascend 310P3
0 2 - - Mcu
"""


def test_template_info_sample() -> None:
    assert parse_template_info(TEMPLATE_INFO) == [
        TemplateSpec("vir10_3c_16g", aicore=10, memory_mb=16 * 1024, aicpu=3, media=4),
        TemplateSpec("vir05_1c_8g", aicore=5, memory_mb=8 * 1024, aicpu=1, media=2),
    ]


def test_template_info_with_fractional_aicpu_rounds_up() -> None:
    text = TEMPLATE_INFO.replace("16        3         4", "16        2.5       4")
    assert parse_template_info(text)[0].aicpu == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'Name AICORE"),
        ("dcmi model initialized failed\n", "no 'Name AICORE"),
        # truncated after the first row's first line
        ("\n".join(TEMPLATE_INFO.splitlines()[:6]), "incomplete"),
        (TEMPLATE_INFO.replace("|vir05_1c_8g         5 ", "|vir05_1c_8g         x "), "bad"),
        (
            TEMPLATE_INFO.replace("4              0              12", "4              0"),
            "incomplete",
        ),
        (TEMPLATE_INFO.replace("vir10_3c_16g", "bogus_name"), "unexpected line"),
        (TEMPLATE_INFO.replace("   0              1              2", "   0              1"), "bad"),
        (TEMPLATE_INFO.replace(" VPC ", " XYZ "), "no VPC column"),
        # header only, or cut off right after a whole template
        ("\n".join(TEMPLATE_INFO.splitlines()[:5]), "empty"),
        ("\n".join(TEMPLATE_INFO.splitlines()[:7]), "not closed"),
    ],
)
def test_template_info_malformed(text: str, message: str) -> None:
    with pytest.raises(MalformedOutputError, match=message) as caught:
        parse_template_info(text)
    assert caught.value.driver_message == text


def test_info_vnpu_sample() -> None:
    table = parse_info_vnpu(INFO_VNPU)
    assert table.free_total("AICORE") == (0, 20)
    assert table.free_total("Memory") == (0, 32)
    assert table.free_total("AICPU") == (1, 7)
    assert table.free_total("VPC") == (1, 9)
    assert table.resources["PNGD"] == (None, None)
    assert table.free_total("PNGD") == (0, 0)
    assert [(v.id, v.in_use, v.template, v.container_id) for v in table.vnpus] == [
        (100, True, "vir10_3c_16g", "ffffffffffff"),
        (101, False, "vir10_3c_16g", "000000000000"),  # created, never opened
    ]
    assert [v.vgroup for v in table.vnpus] == ["0", "1"]


def test_info_vnpu_without_vnpus() -> None:
    table = parse_info_vnpu(INFO_VNPU_EMPTY)
    assert table.vnpus == []
    assert table.free_total("AICORE") == (20, 20)


def test_status_na_counts_as_in_use() -> None:
    text = INFO_VNPU.replace("|  0       |  vir10", "|  NA      |  vir10")
    assert [v.in_use for v in parse_info_vnpu(text).vnpus] == [True, True]


def test_310p_rows_in_hamis_spacing() -> None:
    rows = "\n".join(
        f"|  {100 + i} |  {g} | ffffffffffff | 1 | vir01 |" for i, g in enumerate([0, 0, 1])
    )
    text = INFO_VNPU_EMPTY.replace("Total number of vnpu: 0", "Total number of vnpu: 3") + (
        "|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |\n"
        + rows
        + "\n+"
        + "-" * 79
        + "+\n"
    )
    assert [v.id for v in parse_info_vnpu(text).vnpus] == [100, 101, 102]


def _cut(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[:lines])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'AICORE Memory AICPU"),
        ("   \n", "no 'AICORE Memory AICPU"),
        (_cut(INFO_VNPU, 5), "resource row is missing"),
        (_cut(INFO_VNPU, 8), "no 'Total number of vnpu"),
        (_cut(INFO_VNPU, 13), "has 1 rows but says there are 2"),
        (_cut(INFO_VNPU, 15), "not closed"),
        (_cut(INFO_VNPU_EMPTY, 9), "not closed"),
        (_cut(INFO_VNPU, 11), "has 0 rows but says there are 2"),
        (INFO_VNPU.replace("| 0/20      0/32 ", "| 0/20      0/3x "), "resource row"),
        (INFO_VNPU.replace("| 0/20      0/32      1/7 ", "| 0/20      0/32 "), "resource row"),
        (INFO_VNPU.replace("vnpu: 2", "vnpu: two"), "no 'Total number of vnpu"),
        (INFO_VNPU.replace("|  100      |", "|  1OO      |"), "bad id"),
        (INFO_VNPU.replace("|  1       |", "|  7       |"), "bad id, status"),
        (INFO_VNPU.replace("|  vir10_3c_16g        |\n+", "|  ???   |\n+", 1), "bad id"),
        (INFO_VNPU.replace("|  0             |  ffff", "|  0  ffff"), "cells"),
        (INFO_VNPU.replace("Template Name", "Template"), "header lacks"),
        (INFO_VNPU.replace(" AICPU  ", " AICPX  "), "no AICPU column"),
    ],
)
def test_info_vnpu_malformed(text: str, message: str) -> None:
    with pytest.raises(MalformedOutputError, match=message):
        parse_info_vnpu(text)


def test_chip_list_skips_the_mcu() -> None:
    assert parse_chip_list(CHIP_LIST) == [
        ChipEntry(card_id=0, device_id=0, logic_id=0, physical_id=None, name="Ascend 910B3"),
        ChipEntry(card_id=1, device_id=0, logic_id=1, physical_id=None, name="Ascend 910B3"),
    ]


def test_chip_list_with_physical_ids() -> None:
    assert [
        (c.device_id, c.logic_id, c.physical_id) for c in parse_chip_list(CHIP_LIST_WITH_PHY)
    ] == [
        (0, 0, 4),
        (1, 1, 5),
    ]


def test_chip_list_of_a_host_without_chips() -> None:
    assert parse_chip_list(CHIP_LIST.splitlines()[0]) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'NPU ID"),
        ("dcmi model initialized failed, because the device is used. ret is -8020", "no 'NPU ID"),
        (CHIP_LIST + "\t2   0\n", "too few columns"),
        (
            CHIP_LIST.replace(
                "\t1                              0 ", "\tx                              0 "
            ),
            "non-numeric",
        ),
        (CHIP_LIST + "\t9    0    1    Ascend 910B3\n", "share a logic id"),
    ],
)
def test_chip_list_malformed(text: str, message: str) -> None:
    with pytest.raises(MalformedOutputError, match=message):
        parse_chip_list(text)


def test_set_command_status() -> None:
    ok = (
        "        Status                         : OK\n"
        "        Message                        : Create vnpu success\n"
    )
    assert parse_status(ok) == (True, "Create vnpu success")
    failed = "Status : FAILED\nMessage : destroy vnpu 103 failed. Error code: -8001.\n"
    assert parse_status(failed) == (False, "destroy vnpu 103 failed. Error code: -8001.")
    assert parse_status("Error parameter of -v.\n") == (None, "Error parameter of -v.")
    assert parse_status("") == (None, "")


def test_fields_normalise_keys() -> None:
    assert parse_fields("  VNPU  config recover mode   :  Enable \nno colon here\n") == {
        "vnpu config recover mode": "Enable"
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("VNPU config recover mode : Enable", True),
        ("        VNPU config recover mode       : Disable\n", False),
    ],
)
def test_recover_mode(text: str, expected: bool) -> None:
    assert parse_recover_mode(text) is expected


@pytest.mark.parametrize("text", ["", "VNPU config recover mode : maybe", "Status : OK"])
def test_recover_mode_malformed(text: str) -> None:
    with pytest.raises(MalformedOutputError, match="recover mode"):
        parse_recover_mode(text)


@pytest.mark.parametrize(
    ("text", "healthy"),
    [
        ("        Health Status                  : OK\n", True),
        ("Health Status : Warning\n", True),
        ("Health Status : Alarm\n", False),
        ("Health Status : Critical\nError Code : 80E18005\n", False),
        ("Healthy : UNKNOWN\n", False),
    ],
)
def test_health(text: str, healthy: bool) -> None:
    assert parse_health(text) is healthy


def test_health_malformed() -> None:
    with pytest.raises(MalformedOutputError, match="Health Status"):
        parse_health("Temperature : 40\n")


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("destroy vnpu 103 failed. Error code: -8001.", -8001),
        ("ret is -8020", -8020),
        ("dcmi get info failed, ret = -8005\n", -8005),
        ("vnpu 103 failed", None),
        ("temperature -80.5", None),
        ("id -80011", None),
    ],
)
def test_error_code_in_text(text: str, code: int | None) -> None:
    assert find_error_code(text) == code
