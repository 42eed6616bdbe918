"""Turning a real driver's failure into a typed error.

DCMI and npu-smi report most refusals the same way (the kernel answers
-EINVAL for "over capacity", "id taken" and "in use" alike, and DCMI turns
that into one code), so the backends look at the chip after a failed call to
name the cause. The code table below is the fallback when that look finds
nothing, or cannot be made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from vnpu_agent.drivers.base import (
    ANY_VNPU_ID,
    DCMI_DEVICE_NOT_EXIST,
    DCMI_INVALID_DEVICE_ID,
    DCMI_PARTITION_NOT_RIGHT,
    DCMI_RESOURCE_OCCUPIED,
    VNPU,
    CapacityError,
    ChipInfo,
    DriverError,
    DriverFailure,
    InUseError,
    InvalidIdError,
    InvalidTemplateError,
    NotFoundError,
    TemplateSpec,
)
from vnpu_common.wire import names

Op = Literal["create", "destroy", "query"]
Diagnosis = tuple[type[DriverError], str]

_BY_CODE: dict[tuple[Op, int], type[DriverError]] = {
    ("create", DCMI_RESOURCE_OCCUPIED): CapacityError,
    ("create", DCMI_PARTITION_NOT_RIGHT): InvalidTemplateError,
    ("destroy", DCMI_RESOURCE_OCCUPIED): InUseError,
}


def describe_create(chip: int, template: str, vnpu_id: int) -> str:
    if vnpu_id == ANY_VNPU_ID:
        return f"create a {template} vNPU (any id) on chip {chip}"
    return f"create vNPU {vnpu_id} ({template}) on chip {chip}"


def check_vnpu_id(vnpu_id: int, what: str) -> None:
    """Refuses ids no driver accepts before they reach one: to DCMI, 65535
    means "every vNPU of the device"."""
    if not names.VNPU_ID_MIN <= vnpu_id <= names.VNPU_ID_MAX:
        raise InvalidIdError(
            f"{what} refused: vNPU id {vnpu_id} is outside {names.VNPU_ID_MIN}-{names.VNPU_ID_MAX}"
        )


def error_for_code(op: Op, code: int | None) -> type[DriverError]:
    if code is None:
        return DriverFailure
    if code in (DCMI_INVALID_DEVICE_ID, DCMI_DEVICE_NOT_EXIST):
        return NotFoundError
    return _BY_CODE.get((op, code), DriverFailure)


def diagnose_create(
    chip: ChipInfo,
    templates: Sequence[TemplateSpec],
    vnpus: Sequence[VNPU],
    template: str,
    vnpu_id: int,
) -> Diagnosis | None:
    """Why a create of `template` as `vnpu_id` cannot succeed on `chip`, or
    None if it looks like it should have. `vnpus` are the chip's vNPUs (ids of
    other chips lie outside this chip's range anyway)."""
    spec = next((t for t in templates if t.name == template), None)
    if spec is None:
        offered = ", ".join(t.name for t in templates) or "none"
        return InvalidTemplateError, (
            f"chip {chip.index} ({chip.model}) offers no template {template!r} "
            f"(it offers: {offered})"
        )
    taken = {v.id: v for v in vnpus}
    if vnpu_id != ANY_VNPU_ID:
        if not chip.vnpu_id_min <= vnpu_id <= chip.vnpu_id_max:
            return InvalidIdError, (
                f"vNPU id {vnpu_id} is outside chip {chip.index}'s range "
                f"{chip.vnpu_id_min}-{chip.vnpu_id_max}"
            )
        if vnpu_id in taken:
            # Possibly by this very call, if the driver failed after creating it.
            return InvalidIdError, (
                f"vNPU id {vnpu_id} is already taken (by a {taken[vnpu_id].template} vNPU)"
            )
    elif all(i in taken for i in range(chip.vnpu_id_min, chip.vnpu_id_max + 1)):
        return CapacityError, f"no free vNPU id left on chip {chip.index}"
    short = capacity_shortfall(chip, spec)
    if short:
        return CapacityError, short
    if not chip.healthy:
        return DriverFailure, f"chip {chip.index} is unhealthy"
    return None


def capacity_shortfall(chip: ChipInfo, spec: TemplateSpec) -> str:
    """'' if `spec` fits in what `chip` has free, else which resource is short."""
    checks = (
        ("AICore", spec.aicore, chip.aicore_free, chip.aicore_total, ""),
        ("memory", spec.memory_mb, chip.memory_free_mb, chip.memory_total_mb, " MB"),
        ("AICPU", spec.aicpu, chip.aicpu_free, chip.aicpu_total, ""),
        ("media units", spec.media, chip.media_free, chip.media_total, ""),
    )
    for what, need, free, total, unit in checks:
        if need > free:
            return (
                f"not enough {what} on chip {chip.index}: {spec.name} needs {need}{unit}, "
                f"{free}{unit} of {total}{unit} free"
            )
    return ""


def diagnose_destroy(vnpus: Sequence[VNPU], chip: int, vnpu_id: int) -> Diagnosis | None:
    found = next((v for v in vnpus if v.id == vnpu_id), None)
    if found is None:
        return NotFoundError, f"chip {chip} has no vNPU {vnpu_id}"
    if found.in_use:
        return InUseError, f"vNPU {vnpu_id} is in use by a container"
    return None


def classify(
    op: Op,
    what: str,
    code: int | None,
    driver_message: str,
    probe: Callable[[], Diagnosis | None],
) -> DriverError:
    """The typed error for a failed `op`. `what` names the attempt ("create
    vNPU 100 (vir05_1c_16g) on chip 0"); `probe` looks at the chip to name
    the cause and may itself fail, in which case the code table decides."""
    try:
        found = probe()
    except DriverError:
        found = None
    if found is not None:
        cls, detail = found
        return cls(f"{what} failed: {detail}", code=code, driver_message=driver_message)
    return error_for_code(op, code)(f"{what} failed", code=code, driver_message=driver_message)
