"""ctypes mirrors of the DCMI structs and prototypes (dcmi_interface_api.h).

Field order and types follow the public header (docs/ASCEND.md, 'DCMI C API');
`dcmi_chip_info` and the device-listing functions are from the same header
but not quoted there. Tests assert every size and offset docs/ASCEND.md lists.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_float,
    c_int,
    c_uint,
    c_ulonglong,
    c_ushort,
    c_void_p,
)
from typing import Final

c_ubyte = ctypes.c_ubyte

DCMI_VDEV_RES_NAME_LEN: Final = 16
DCMI_VDEV_FOR_RESERVE: Final = 32
DCMI_SOC_SPLIT_MAX: Final = 32
DCMI_VDEV_SIZE: Final = 2 * 8 + 4  # (2 * sizeof(unsigned long long)) + sizeof(unsigned int)
TEMPLATE_NAME_LEN: Final = 32
MAX_CHIP_NAME_LEN: Final = 32
MAX_CARD_NUM: Final = 64

DCMI_MAIN_CMD_VDEV_MNG: Final = 52
DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE: Final = 0
DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE: Final = 1
DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE: Final = 2

# dcmi_set_destroy_vdevice with this id destroys every vNPU of the device.
DCMI_DESTROY_ALL_VDEV: Final = 65535
# is_container_used when the driver cannot tell ("NA").
CONTAINER_USED_NA: Final = 0xFFFFFFFF
# dcmi_get_device_health: 0 OK, 1 general (minor) alarm, 2 major, 3 critical.
HEALTHY_CODES: Final = frozenset({0, 1})


class DcmiBaseResource(Structure):
    _fields_ = [
        ("token", c_ulonglong),
        ("token_max", c_ulonglong),
        ("task_timeout", c_ulonglong),
        ("vfg_id", c_uint),
        ("vip_mode", c_ubyte),
        ("reserved", c_ubyte * (DCMI_VDEV_FOR_RESERVE - 1)),
    ]


class DcmiComputingResource(Structure):
    _fields_ = [
        ("aic", c_float),
        ("aiv", c_float),
        ("dsa", c_ushort),
        ("rtsq", c_ushort),
        ("acsq", c_ushort),
        ("cdqm", c_ushort),
        ("c_core", c_ushort),
        ("ffts", c_ushort),
        ("sdma", c_ushort),
        ("pcie_dma", c_ushort),
        ("memory_size", c_ulonglong),  # MB
        ("event_id", c_uint),
        ("notify_id", c_uint),
        ("stream_id", c_uint),
        ("model_id", c_uint),
        ("topic_schedule_aicpu", c_ushort),
        ("host_ctrl_cpu", c_ushort),
        ("host_aicpu", c_ushort),
        ("device_aicpu", c_ushort),
        ("topic_ctrl_cpu_slot", c_ushort),
        ("vdev_aicore_utilization", c_uint),
        ("vdev_memory_total", c_ulonglong),
        ("vdev_memory_free", c_ulonglong),
        ("reserved", c_ubyte * (DCMI_VDEV_FOR_RESERVE - DCMI_VDEV_SIZE)),
    ]


class DcmiMediaResource(Structure):
    _fields_ = [
        ("jpegd", c_float),
        ("jpege", c_float),
        ("vpc", c_float),
        ("vdec", c_float),
        ("pngd", c_float),
        ("venc", c_float),
        ("reserved", c_ubyte * DCMI_VDEV_FOR_RESERVE),
    ]


class DcmiCreateVdevResStru(Structure):
    _fields_ = [
        ("vdev_id", c_uint),
        ("vfg_id", c_uint),
        ("template_name", c_char * TEMPLATE_NAME_LEN),
        ("reserved", c_ubyte * 64),
    ]


class DcmiCreateVdevOut(Structure):
    _fields_ = [
        ("vdev_id", c_uint),
        ("pcie_bus", c_uint),
        ("pcie_device", c_uint),
        ("pcie_func", c_uint),
        ("vfg_id", c_uint),
        ("reserved", c_ubyte * DCMI_VDEV_FOR_RESERVE),
    ]


class DcmiVdevQueryInfo(Structure):
    _fields_ = [
        ("name", c_char * DCMI_VDEV_RES_NAME_LEN),
        ("status", c_uint),
        ("is_container_used", c_uint),
        ("vfid", c_uint),
        ("vfg_id", c_uint),
        ("container_id", c_ulonglong),
        ("base", DcmiBaseResource),
        ("computing", DcmiComputingResource),
        ("media", DcmiMediaResource),
    ]


class DcmiVdevQueryStru(Structure):
    _fields_ = [("vdev_id", c_uint), ("query_info", DcmiVdevQueryInfo)]


class DcmiSocFreeResource(Structure):
    _fields_ = [
        ("vfg_num", c_uint),
        ("vfg_bitmap", c_uint),
        ("base", DcmiBaseResource),
        ("computing", DcmiComputingResource),
        ("media", DcmiMediaResource),
    ]


class DcmiSocTotalResource(Structure):
    _fields_ = [
        ("vdev_num", c_uint),
        ("vdev_id", c_uint * DCMI_SOC_SPLIT_MAX),
        ("vfg_num", c_uint),
        ("vfg_bitmap", c_uint),
        ("base", DcmiBaseResource),
        ("computing", DcmiComputingResource),
        ("media", DcmiMediaResource),
    ]


class DcmiChipInfo(Structure):
    _fields_ = [
        ("chip_type", c_ubyte * MAX_CHIP_NAME_LEN),
        ("chip_name", c_ubyte * MAX_CHIP_NAME_LEN),
        ("chip_ver", c_ubyte * MAX_CHIP_NAME_LEN),
        ("aicore_cnt", c_uint),
    ]


_INT_P = POINTER(c_int)
_UINT_P = POINTER(c_uint)

# name -> argtypes; every function returns int (0 on success, a DCMI code else).
PROTOTYPES: Final[dict[str, list[type]]] = {
    "dcmi_init": [],
    "dcmi_get_card_num_list": [_INT_P, _INT_P, c_int],
    "dcmi_get_device_num_in_card": [c_int, _INT_P],
    "dcmi_get_device_logic_id": [_INT_P, c_int, c_int],
    "dcmi_get_device_phyid_from_logicid": [c_uint, _UINT_P],
    "dcmi_get_device_chip_info": [c_int, c_int, POINTER(DcmiChipInfo)],
    "dcmi_get_device_health": [c_int, c_int, _UINT_P],
    "dcmi_get_device_info": [c_int, c_int, c_int, c_uint, c_void_p, _UINT_P],
    "dcmi_create_vdevice": [
        c_int,
        c_int,
        POINTER(DcmiCreateVdevResStru),
        POINTER(DcmiCreateVdevOut),
    ],
    "dcmi_set_destroy_vdevice": [c_int, c_int, c_uint],
    "dcmi_get_vnpu_config_recover_mode": [_UINT_P],
    "dcmi_set_vnpu_config_recover_mode": [c_uint],
}


def c_text(raw: bytes | ctypes.Array[c_ubyte]) -> str:
    """A NUL-terminated C string field as text."""
    data = bytes(raw)
    return data.split(b"\0", 1)[0].decode("utf-8", errors="replace")
