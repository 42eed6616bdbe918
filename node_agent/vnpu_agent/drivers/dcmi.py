"""`dcmi`: binds libdcmi.so with ctypes (structs in dcmi_types.py).

Chips are enumerated once (card list -> devices per card -> logic id,
physical id, chip name); resources come from `dcmi_get_device_info` with
DCMI_MAIN_CMD_VDEV_MNG (total, free, per-vdev), health from
`dcmi_get_device_health`. DCMI has no public template list, so templates
come from the model catalog keyed by the chip name DCMI reports
(`dcmi_get_device_chip_info`, e.g. "910B3"); an unknown model is an error,
never a guess.

DCMI answers most refusals with one code, so after a failed create or
destroy the chip is queried to name the cause (see diagnose.py). Ids outside
100..1123 are refused before any call: 65535 tells DCMI to destroy every
vNPU of the device.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_int, c_uint, sizeof
from dataclasses import dataclass
from typing import Any

from vnpu_agent.drivers import dcmi_types as t
from vnpu_agent.drivers.base import (
    ANY_VNPU_ID,
    VNPU,
    ChipInfo,
    DriverFailure,
    InvalidTemplateError,
    MalformedOutputError,
    NotFoundError,
    TemplateSpec,
)
from vnpu_agent.drivers.catalog import find_model, id_range, ids_per_chip_for, normalize_model
from vnpu_agent.drivers.diagnose import (
    Op,
    check_vnpu_id,
    classify,
    describe_create,
    diagnose_create,
    diagnose_destroy,
    error_for_code,
)

DEFAULT_LIBRARY = "libdcmi.so"


@dataclass(frozen=True)
class _Device:
    logic_id: int
    card_id: int
    device_id: int
    physical_id: int
    model: str


class DcmiDriver:
    name = "dcmi"

    def __init__(self, library: str = DEFAULT_LIBRARY) -> None:
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise DriverFailure(f"cannot load DCMI library {library}: {exc}") from exc
        self._fns: dict[str, Any] = {}
        for fn_name, argtypes in t.PROTOTYPES.items():
            try:
                fn = getattr(self._lib, fn_name)
            except AttributeError:
                raise DriverFailure(f"DCMI library {library} lacks {fn_name}") from None
            fn.argtypes = argtypes
            fn.restype = c_int
            self._fns[fn_name] = fn
        self._call("dcmi_init", "initialise DCMI")
        self._devices: list[_Device] | None = None

    # ------------------------------------------------------------------ queries

    def list_chips(self) -> list[ChipInfo]:
        return [self._chip_info(dev) for dev in self._topology()]

    def list_templates(self, chip: int) -> list[TemplateSpec]:
        dev = self._device(chip)
        model = find_model(dev.model)
        if model is None:
            raise DriverFailure(
                f"no template catalog for chip model {dev.model!r} of chip {chip}; "
                "DCMI cannot list templates, so the agent only knows the catalog's models"
            )
        return list(model.templates)

    def list_vnpus(self, chip: int) -> list[VNPU]:
        dev = self._device(chip)
        total = self._total(dev)
        if total.vdev_num > t.DCMI_SOC_SPLIT_MAX:
            raise MalformedOutputError(
                f"DCMI reports {total.vdev_num} vNPUs on chip {chip}, "
                f"more than its limit of {t.DCMI_SOC_SPLIT_MAX}"
            )
        return [self._query_vdev(dev, total.vdev_id[i]) for i in range(total.vdev_num)]

    def config_recover_enabled(self) -> bool:
        mode = c_uint(0)
        self._call("dcmi_get_vnpu_config_recover_mode", "query config-recover mode", byref(mode))
        if mode.value not in (0, 1):
            raise MalformedOutputError(f"DCMI reports config-recover mode {mode.value}, not 0 or 1")
        return mode.value == 1

    # ------------------------------------------------------------------ changes

    def create_vnpu(self, chip: int, template: str, vnpu_id: int) -> VNPU:
        dev = self._device(chip)
        what = describe_create(chip, template, vnpu_id)
        if vnpu_id != ANY_VNPU_ID:
            check_vnpu_id(vnpu_id, what)
        encoded = template.encode("ascii", errors="replace")
        if len(encoded) >= t.TEMPLATE_NAME_LEN or b"\0" in encoded:
            raise InvalidTemplateError(f"{what} failed: template name {template!r} is not valid")
        request = t.DcmiCreateVdevResStru(vdev_id=vnpu_id, vfg_id=0xFFFFFFFF, template_name=encoded)
        out = t.DcmiCreateVdevOut()
        rc = self._fns["dcmi_create_vdevice"](
            dev.card_id, dev.device_id, byref(request), byref(out)
        )
        if rc != 0:
            raise classify(
                "create",
                what,
                rc,
                f"dcmi_create_vdevice returned {rc}",
                lambda: diagnose_create(
                    self._chip_info(dev),
                    self.list_templates(chip),
                    self.list_vnpus(chip),
                    template,
                    vnpu_id,
                ),
            )
        if vnpu_id != ANY_VNPU_ID and out.vdev_id != vnpu_id:
            raise DriverFailure(f"{what}: DCMI created vNPU {out.vdev_id} instead")
        return VNPU(id=out.vdev_id, chip=chip, template=template, in_use=False)

    def destroy_vnpu(self, chip: int, vnpu_id: int) -> None:
        dev = self._device(chip)
        what = f"destroy vNPU {vnpu_id} on chip {chip}"
        check_vnpu_id(vnpu_id, what)
        rc = self._fns["dcmi_set_destroy_vdevice"](dev.card_id, dev.device_id, vnpu_id)
        if rc != 0:
            raise classify(
                "destroy",
                what,
                rc,
                f"dcmi_set_destroy_vdevice returned {rc}",
                lambda: diagnose_destroy(self.list_vnpus(chip), chip, vnpu_id),
            )

    def set_config_recover(self, enabled: bool) -> None:
        what = f"{'enable' if enabled else 'disable'} config-recover mode"
        self._call("dcmi_set_vnpu_config_recover_mode", what, 1 if enabled else 0)

    # ---------------------------------------------------------------- internals

    def _call(self, fn_name: str, what: str, *args: Any, op: Op = "query") -> None:
        rc = self._fns[fn_name](*args)
        if rc != 0:
            raise error_for_code(op, rc)(
                f"{what} failed", code=rc, driver_message=f"{fn_name} returned {rc}"
            )

    def _topology(self) -> list[_Device]:
        if self._devices is None:
            self._devices = sorted(self._enumerate(), key=lambda d: d.logic_id)
        return self._devices

    def _enumerate(self) -> list[_Device]:
        count = c_int(0)
        cards = (c_int * t.MAX_CARD_NUM)()
        self._call("dcmi_get_card_num_list", "list cards", byref(count), cards, t.MAX_CARD_NUM)
        if not 0 <= count.value <= t.MAX_CARD_NUM:
            raise MalformedOutputError(f"DCMI reports {count.value} cards")
        devices: list[_Device] = []
        for card in cards[: count.value]:
            per_card = c_int(0)
            self._call(
                "dcmi_get_device_num_in_card", f"count chips of card {card}", card, byref(per_card)
            )
            for device in range(per_card.value):
                devices.append(self._describe(card, device))
        if len({d.logic_id for d in devices}) != len(devices):
            raise MalformedOutputError("DCMI reports two chips with one logic id")
        return devices

    def _describe(self, card: int, device: int) -> _Device:
        where = f"chip {device} of card {card}"
        logic = c_int(0)
        self._call("dcmi_get_device_logic_id", f"logic id of {where}", byref(logic), card, device)
        phy = c_uint(0)
        self._call(
            "dcmi_get_device_phyid_from_logicid", f"physical id of {where}", logic.value, byref(phy)
        )
        info = t.DcmiChipInfo()
        self._call("dcmi_get_device_chip_info", f"chip info of {where}", card, device, byref(info))
        name = normalize_model(t.c_text(info.chip_name))
        if not name:
            raise MalformedOutputError(f"DCMI reports an empty chip name for {where}")
        return _Device(logic.value, card, device, phy.value, name)

    def _device(self, chip: int) -> _Device:
        found = next((d for d in self._topology() if d.logic_id == chip), None)
        if found is None:
            raise NotFoundError(f"DCMI lists no chip with logic id {chip}")
        return found

    def _device_info(self, dev: _Device, sub_cmd: int, buf: ctypes.Structure, what: str) -> None:
        size = c_uint(sizeof(buf))
        self._call(
            "dcmi_get_device_info",
            what,
            dev.card_id,
            dev.device_id,
            t.DCMI_MAIN_CMD_VDEV_MNG,
            sub_cmd,
            byref(buf),
            byref(size),
        )

    def _total(self, dev: _Device) -> t.DcmiSocTotalResource:
        total = t.DcmiSocTotalResource()
        what = f"total resources of chip {dev.logic_id}"
        self._device_info(dev, t.DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE, total, what)
        return total

    def _query_vdev(self, dev: _Device, vdev_id: int) -> VNPU:
        query = t.DcmiVdevQueryStru(vdev_id=vdev_id)
        what = f"query vNPU {vdev_id} of chip {dev.logic_id}"
        self._device_info(dev, t.DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE, query, what)
        info = query.query_info
        return VNPU(
            id=vdev_id,
            chip=dev.logic_id,
            template=t.c_text(info.name),
            # Anything but a clear 0 (including "NA") counts as in use, so
            # that nothing is destroyed or reclaimed on a guess.
            in_use=info.is_container_used != 0,
        )

    def _chip_info(self, dev: _Device) -> ChipInfo:
        total = self._total(dev)
        free = t.DcmiSocFreeResource()
        what = f"free resources of chip {dev.logic_id}"
        self._device_info(dev, t.DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE, free, what)
        health = c_uint(0)
        self._call(
            "dcmi_get_device_health",
            f"health of chip {dev.logic_id}",
            dev.card_id,
            dev.device_id,
            byref(health),
        )
        low, high = id_range(dev.physical_id, ids_per_chip_for(dev.model))
        tc, fc = total.computing, free.computing
        return ChipInfo(
            index=dev.logic_id,
            physical_id=dev.physical_id,
            card_id=dev.card_id,
            device_id=dev.device_id,
            model=dev.model,
            healthy=health.value in t.HEALTHY_CODES,
            aicore_total=int(tc.aic),
            aicore_free=int(fc.aic),
            memory_total_mb=tc.memory_size,
            memory_free_mb=fc.memory_size,
            aicpu_total=tc.device_aicpu,
            aicpu_free=fc.device_aicpu,
            media_total=int(total.media.vpc),
            media_free=int(free.media.vpc),
            vnpu_id_min=low,
            vnpu_id_max=high,
        )
