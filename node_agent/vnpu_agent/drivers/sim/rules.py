"""The simulator's rules as pure functions over its state (state.py):
what a chip has free, whether a create is allowed and which id it gets,
injected failures, and the replay of the config-recover file at boot.
SimDriver (engine.py) wraps each call in a locked transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vnpu_agent.drivers.base import (
    ANY_VNPU_ID,
    DCMI_INNER_ERR,
    DCMI_INVALID_DEVICE_ID,
    DCMI_INVALID_PARAMETER,
    VNPU,
    CapacityError,
    ChipInfo,
    DriverFailure,
    InvalidIdError,
    InvalidTemplateError,
    NotFoundError,
    TemplateSpec,
)
from vnpu_agent.drivers.catalog import (
    ChipModel,
    Usage,
    capacity_failure,
    find_model,
    known_models,
)
from vnpu_agent.drivers.diagnose import Op, capacity_shortfall, error_for_code
from vnpu_agent.drivers.sim import recover
from vnpu_agent.drivers.sim.state import OPS, SimChip, SimState, SimStateError, SimVnpu

MAX_CHIPS = 64  # phy 63 tops out at id 1123, the last valid vNPU id


@dataclass(frozen=True)
class RebootReport:
    replayed: list[int] = field(default_factory=list)  # vNPU ids brought back
    skipped: list[str] = field(default_factory=list)  # config lines that failed, and why


def parse_layout(layout: Mapping[str, int] | str) -> list[tuple[str, int]]:
    """{"910B3": 4, "310P3": 2} or "910B3=4,310P3=2" -> [("910B3", 4), ("310P3", 2)].
    Adjacent entries of one model merge. Raises SimStateError if invalid."""
    pairs: list[tuple[str, object]]
    if isinstance(layout, str):
        pairs = []
        for item in (p.strip() for p in layout.split(",")):
            name, sep, number = item.partition("=")
            if not sep:
                raise SimStateError(f"chip layout item {item!r} is not MODEL=COUNT")
            pairs.append((name.strip(), number.strip()))
    else:
        pairs = list(layout.items())
    out: list[tuple[str, int]] = []
    for name, raw in pairs:
        model = find_model(name)
        if model is None:
            raise SimStateError(
                f"unknown chip model {name!r} in chip layout; known: {', '.join(known_models())}"
            )
        try:
            count = raw if type(raw) is int else int(str(raw), 10)
        except ValueError:
            count = 0
        if count < 1:
            raise SimStateError(f"chip count {raw!r} for {name} must be a positive integer")
        if out and out[-1][0] == model.name:
            out[-1] = (model.name, out[-1][1] + count)
        else:
            out.append((model.name, count))
    total = sum(n for _, n in out)
    if not 1 <= total <= MAX_CHIPS:
        raise SimStateError(f"chip layout must have 1 to {MAX_CHIPS} chips, not {total}")
    return out


def format_layout(layout: list[tuple[str, int]]) -> str:
    return ",".join(f"{m}={n}" for m, n in layout)


def new_state(layout: list[tuple[str, int]]) -> SimState:
    chips: list[SimChip] = []
    for model, count in layout:
        for _ in range(count):
            i = len(chips)
            chips.append(SimChip(index=i, model=model, physical_id=i, card_id=i, device_id=0))
    return SimState(chips=chips)


def check_op(op: str) -> None:
    if op not in OPS:
        raise SimStateError(f"unknown operation {op!r}; use one of {', '.join(OPS)}")


def fire_failure(state: SimState, op: Op, what: str, *, after: bool) -> None:
    failure = state.failures.get(op)
    if failure is None or failure.after != after:
        return
    if failure.times is not None:
        failure.times -= 1
        if failure.times <= 0:
            del state.failures[op]
    state.keep_on_error = True
    raise error_for_code(op, failure.code)(
        f"{what} failed (injected fault)",
        code=failure.code,
        driver_message=failure.message or f"{op} failed, ret:{failure.code}",
    )


def find_chip(state: SimState, index: int) -> SimChip:
    if 0 <= index < len(state.chips):
        return state.chips[index]
    raise NotFoundError(
        f"no chip {index} on this node (it has {len(state.chips)})",
        code=DCMI_INVALID_DEVICE_ID,
        driver_message=f"device id {index} is invalid",
    )


def find_vnpu(state: SimState, vnpu_id: int, action: str) -> SimVnpu:
    found = state.vnpus.get(vnpu_id)
    if found is None:
        raise NotFoundError(f"{action} vNPU {vnpu_id} failed: no such vNPU")
    return found


def model_of(chip: SimChip) -> ChipModel:
    model = find_model(chip.model)
    if model is None:
        raise SimStateError(f"chip {chip.index} has unknown model {chip.model!r} in the state")
    return model


def spec_of(model: ChipModel, vnpu: SimVnpu) -> TemplateSpec:
    spec = model.template(vnpu.template)
    if spec is None:
        raise SimStateError(
            f"vNPU {vnpu.id} has template {vnpu.template!r} unknown to {model.name}"
        )
    return spec


def usage_of(state: SimState, chip: SimChip) -> Usage:
    model = model_of(chip)
    return Usage.of(spec_of(model, v) for v in state.vnpus.values() if v.chip == chip.index)


def chip_info(state: SimState, chip: SimChip) -> ChipInfo:
    model = model_of(chip)
    used = usage_of(state, chip)
    low, high = model.id_range(chip.physical_id)
    return ChipInfo(
        index=chip.index,
        physical_id=chip.physical_id,
        card_id=chip.card_id,
        device_id=chip.device_id,
        model=model.name,
        healthy=chip.healthy,
        aicore_total=model.aicore,
        aicore_free=model.aicore - used.aicore,
        memory_total_mb=model.memory_mb,
        memory_free_mb=model.memory_mb - used.memory_mb,
        aicpu_total=model.aicpu,
        aicpu_free=model.aicpu - used.aicpu,
        media_total=model.media,
        media_free=model.media - used.media,
        vnpu_id_min=low,
        vnpu_id_max=high,
    )


def to_public(vnpu: SimVnpu) -> VNPU:
    return VNPU(id=vnpu.id, chip=vnpu.chip, template=vnpu.template, in_use=vnpu.in_use)


def check_create(state: SimState, chip: SimChip, template: str, vnpu_id: int, what: str) -> int:
    """The id the vNPU gets, or the driver's refusal."""
    model = model_of(chip)
    phy = chip.physical_id
    if not chip.healthy:
        raise DriverFailure(
            f"{what} failed: chip {chip.index} is unhealthy",
            code=DCMI_INNER_ERR,
            driver_message=f"device(phy_id:{phy}) is abnormal, create vdev failed",
        )
    spec = model.template(template)
    if spec is None:
        offered = ", ".join(t.name for t in model.templates)
        raise InvalidTemplateError(
            f"{what} failed: {model.name} offers no template {template!r} (it offers: {offered})",
            code=DCMI_INVALID_PARAMETER,
            driver_message=f"template name {template} is invalid, phy_id:{phy}",
        )
    low, high = model.id_range(phy)
    if vnpu_id == ANY_VNPU_ID:
        free = [i for i in range(low, high + 1) if i not in state.vnpus]
        if not free:
            raise CapacityError(
                f"{what} failed: no free vNPU id left on chip {chip.index}",
                code=DCMI_INVALID_PARAMETER,
                driver_message=f"no free vdev id, phy_id:{phy}",
            )
        new_id = free[0]
    elif not low <= vnpu_id <= high:
        raise InvalidIdError(
            f"{what} failed: vNPU id {vnpu_id} is outside chip {chip.index}'s range {low}-{high}",
            code=DCMI_INVALID_PARAMETER,
            driver_message=f"vdev_id({vnpu_id}) is invalid, phy_id:{phy}, range:[{low}, {high}]",
        )
    elif vnpu_id in state.vnpus:
        raise InvalidIdError(
            f"{what} failed: vNPU id {vnpu_id} is already taken",
            code=DCMI_INVALID_PARAMETER,
            driver_message=f"vdev_id({vnpu_id}) is already exist",
        )
    else:
        new_id = vnpu_id
    kernel = capacity_failure(model, phy, usage_of(state, chip), spec)
    if kernel:
        short = capacity_shortfall(chip_info(state, chip), spec)
        raise CapacityError(
            f"{what} failed: {short}", code=DCMI_INVALID_PARAMETER, driver_message=kernel
        )
    return new_id


def replay(state: SimState, line: str, report: RebootReport) -> None:
    entry = recover.parse_line(line)
    if entry is None:
        report.skipped.append(f"{line!r}: not a create-vnpu record")
        return
    chip = next((c for c in state.chips if c.physical_id == entry.physical_id), None)
    if chip is None:
        report.skipped.append(f"{line!r}: no chip with physical id {entry.physical_id}")
        return
    what = f"replay vNPU {entry.vnpu_id} ({entry.template}) on chip {chip.index}"
    try:
        new_id = check_create(state, chip, entry.template, entry.vnpu_id, what)
    except (CapacityError, InvalidIdError, InvalidTemplateError, DriverFailure) as exc:
        report.skipped.append(f"{line!r}: {exc}")
        return
    state.vnpus[new_id] = SimVnpu(id=new_id, chip=chip.index, template=entry.template)
    report.replayed.append(new_id)
