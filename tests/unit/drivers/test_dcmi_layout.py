"""The ctypes structs have exactly the sizes and offsets of docs/ASCEND.md,
'Struct sizes and offsets' (x86_64 LP64, natural alignment)."""

from __future__ import annotations

import ctypes

import pytest

from vnpu_agent.drivers import dcmi_types as t


@pytest.mark.parametrize(
    ("struct", "size"),
    [
        (t.DcmiBaseResource, 64),
        (t.DcmiComputingResource, 96),
        (t.DcmiMediaResource, 56),
        (t.DcmiCreateVdevResStru, 104),
        (t.DcmiCreateVdevOut, 52),
        (t.DcmiVdevQueryInfo, 256),
        (t.DcmiVdevQueryStru, 264),
        (t.DcmiSocTotalResource, 360),
        (t.DcmiSocFreeResource, 224),
        (t.DcmiChipInfo, 100),
    ],
)
def test_sizes(struct: type[ctypes.Structure], size: int) -> None:
    assert ctypes.sizeof(struct) == size


@pytest.mark.parametrize(
    ("struct", "field", "offset"),
    [
        (t.DcmiBaseResource, "vfg_id", 24),
        (t.DcmiBaseResource, "vip_mode", 28),
        (t.DcmiComputingResource, "memory_size", 24),
        (t.DcmiComputingResource, "device_aicpu", 54),
        (t.DcmiComputingResource, "vdev_aicore_utilization", 60),
        (t.DcmiComputingResource, "vdev_memory_total", 64),
        (t.DcmiComputingResource, "vdev_memory_free", 72),
        (t.DcmiCreateVdevResStru, "template_name", 8),
        (t.DcmiVdevQueryInfo, "status", 16),
        (t.DcmiVdevQueryInfo, "is_container_used", 20),
        (t.DcmiVdevQueryInfo, "vfid", 24),
        (t.DcmiVdevQueryInfo, "vfg_id", 28),
        (t.DcmiVdevQueryInfo, "container_id", 32),
        (t.DcmiVdevQueryInfo, "base", 40),
        (t.DcmiVdevQueryInfo, "computing", 104),
        (t.DcmiVdevQueryInfo, "media", 200),
        (t.DcmiVdevQueryStru, "query_info", 8),
        (t.DcmiSocTotalResource, "vdev_id", 4),
        (t.DcmiSocTotalResource, "base", 144),
    ],
)
def test_offsets(struct: type[ctypes.Structure], field: str, offset: int) -> None:
    assert getattr(struct, field).offset == offset


def test_constants() -> None:
    assert t.DCMI_VDEV_SIZE == 20
    assert t.DCMI_MAIN_CMD_VDEV_MNG == 52
    assert (
        t.DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE,
        t.DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE,
        t.DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE,
    ) == (0, 1, 2)
    assert len(t.DcmiSocTotalResource().vdev_id) == t.DCMI_SOC_SPLIT_MAX == 32


def test_template_name_takes_31_characters_and_a_nul() -> None:
    res = t.DcmiCreateVdevResStru(template_name=b"x" * 31)
    assert bytes(res)[8 : 8 + 32] == b"x" * 31 + b"\0"
    with pytest.raises(ValueError, match="too long"):
        t.DcmiCreateVdevResStru(template_name=b"x" * 33)


def test_c_text_stops_at_the_nul() -> None:
    info = t.DcmiChipInfo()
    ctypes.memmove(info.chip_name, b"910B3\0garbage", 13)
    assert t.c_text(info.chip_name) == "910B3"
    assert t.c_text(b"\xffab\0") == "\ufffdab"
