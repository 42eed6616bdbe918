"""The one interface every driver backend implements, and its typed errors.

The agent calls a driver synchronously from a worker thread
(`asyncio.to_thread`), one call at a time per node, so backends need no
locking of their own against the agent; the simulator still locks its state
file because test code and the CLI change it from other processes.

`chip` is always the chip index on the node: npu-smi's "Chip Logic ID".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final, Protocol, runtime_checkable

# vNPU id that asks the driver to pick one (dcmi_create_vdev_res_stru.vdev_id).
ANY_VNPU_ID: Final = 0xFFFFFFFF

# DCMI return codes (base DCMI_ERROR_CODE_BASE = -8000), for messages.
DCMI_ERROR_NAMES: Final[dict[int, str]] = {
    -8001: "INVALID_PARAMETER",
    -8002: "OPER_NOT_PERMITTED",
    -8005: "INNER_ERR",
    -8007: "INVALID_DEVICE_ID",
    -8008: "DEVICE_NOT_EXIST",
    -8009: "IOCTL_FAIL",
    -8013: "NOT_SUPPORT_IN_CONTAINER",
    -8020: "RESOURCE_OCCUPIED",
    -8022: "PARTITION_NOT_RIGHT",
    -8255: "NOT_SUPPORT",
}
DCMI_INVALID_PARAMETER: Final = -8001
DCMI_INNER_ERR: Final = -8005
DCMI_INVALID_DEVICE_ID: Final = -8007
DCMI_DEVICE_NOT_EXIST: Final = -8008
DCMI_RESOURCE_OCCUPIED: Final = -8020
DCMI_PARTITION_NOT_RIGHT: Final = -8022

# Driver text can be a whole npu-smi screen; a condition message needs a line.
_MAX_DRIVER_TEXT = 600


@dataclass(frozen=True)
class TemplateSpec:
    """A template a chip offers and what one vNPU of it takes."""

    name: str
    aicore: int
    memory_mb: int
    aicpu: int
    media: int  # media (DVPP) units taken; see catalog.py for the unit


@dataclass(frozen=True)
class ChipInfo:
    index: int
    physical_id: int
    card_id: int
    device_id: int
    model: str
    healthy: bool
    aicore_total: int
    aicore_free: int
    memory_total_mb: int
    memory_free_mb: int
    aicpu_total: int
    aicpu_free: int
    media_total: int
    media_free: int
    vnpu_id_min: int  # inclusive id range of this chip
    vnpu_id_max: int


@dataclass(frozen=True)
class VNPU:
    id: int
    chip: int
    template: str
    in_use: bool  # the driver's is_container_used flag


@runtime_checkable
class Driver(Protocol):
    name: str  # "sim" | "npu-smi" | "dcmi"

    def list_chips(self) -> list[ChipInfo]: ...

    def list_templates(self, chip: int) -> list[TemplateSpec]: ...

    def list_vnpus(self, chip: int) -> list[VNPU]: ...

    def create_vnpu(self, chip: int, template: str, vnpu_id: int) -> VNPU: ...

    def destroy_vnpu(self, chip: int, vnpu_id: int) -> None: ...

    def config_recover_enabled(self) -> bool: ...

    def set_config_recover(self, enabled: bool) -> None: ...


def code_label(code: int) -> str:
    name = DCMI_ERROR_NAMES.get(code)
    return f"{code} {name}" if name else str(code)


def _one_line(text: str) -> str:
    flat = "; ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    if len(flat) > _MAX_DRIVER_TEXT:
        flat = flat[: _MAX_DRIVER_TEXT - 3] + "..."
    return flat


class DriverError(Exception):
    """A driver call failed. `message` says what we tried and why it failed;
    `code` is the driver's (DCMI) code if it gave one; `driver_message` is
    the driver's own text. `reason` is a CamelCase word usable as a
    Kubernetes condition reason."""

    reason: ClassVar[str] = "DriverError"

    def __init__(self, message: str, *, code: int | None = None, driver_message: str = "") -> None:
        super().__init__(message, code, driver_message)
        self.message = message
        self.code = code
        self.driver_message = driver_message

    def __str__(self) -> str:
        details: list[str] = []
        if self.code is not None:
            details.append(f"driver code {code_label(self.code)}")
        if self.driver_message.strip():
            details.append(f'driver said "{_one_line(self.driver_message)}"')
        if not details:
            return self.message
        return f"{self.message} ({', '.join(details)})"

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments would otherwise be lost when pickled.
        return (_rebuild, (type(self), self.message, self.code, self.driver_message))


def _rebuild(
    cls: type[DriverError], message: str, code: int | None, driver_message: str
) -> DriverError:
    return cls(message, code=code, driver_message=driver_message)


class CapacityError(DriverError):
    """Not enough AICore, memory, AICPU, media units or ids left on the chip."""

    reason = "InsufficientCapacity"


class InUseError(DriverError):
    """The vNPU is open in a container (is_container_used = 1)."""

    reason = "VNPUInUse"


class NotFoundError(DriverError):
    """No such chip or vNPU."""

    reason = "NotFound"


class InvalidTemplateError(DriverError):
    """The chip does not offer this template."""

    reason = "InvalidTemplate"


class InvalidIdError(DriverError):
    """The vNPU id is outside the chip's range or already taken."""

    reason = "InvalidVNPUId"


class DriverFailure(DriverError):  # noqa: N818 - the name the agent and docs use
    """Anything else: driver refused for another reason, crashed, timed out."""

    reason = "DriverFailure"


class MalformedOutputError(DriverFailure):
    """The driver answered with something we cannot parse."""

    reason = "MalformedDriverOutput"
