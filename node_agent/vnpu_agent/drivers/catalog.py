"""Template catalog per chip model, id ranges and the capacity rule.

The real backends read templates from the driver at run time where they can;
the simulator, the dcmi backend (DCMI has no public template list) and tests
use this catalog. Numbers come from docs/ASCEND.md, 'Templates'; those marked "inferred" are
not published and were chosen to be consistent with the published ones.

Media unit: one VPC (video pre-processing) channel, the first DVPP column of
`npu-smi info -t template-info` and `info-vnpu`. On 910B4 the published
sample shows 9 VPC per chip, vir10_3c_16g taking 4 and vir05_1c_8g taking 2;
the other DVPP engines (VENC, VDEC, JPEGD, JPEGE, PNGD) scale with it, so one
number is enough to decide whether a template still fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vnpu_agent.drivers.base import TemplateSpec

GB = 1024  # MB per GB, as npu-smi prints memory in GB

# VDAVINCI_MAX_VFID_NUM is 16 per physical device; 310P exposes only 8.
IDS_PER_PHY_TRAINING = 16
IDS_PER_PHY_310P = 8
ID_BASE = 100
ID_STRIDE = 16


@dataclass(frozen=True)
class ChipModel:
    name: str
    aicore: int
    memory_mb: int
    aicpu: int
    media: int
    ids_per_chip: int
    templates: tuple[TemplateSpec, ...]

    def template(self, name: str) -> TemplateSpec | None:
        return next((t for t in self.templates if t.name == name), None)

    def id_range(self, physical_id: int) -> tuple[int, int]:
        return id_range(physical_id, self.ids_per_chip)


def id_range(physical_id: int, ids_per_chip: int) -> tuple[int, int]:
    """Inclusive vNPU id range of a physical chip: [phy*16+100, phy*16+100+n-1]."""
    low = physical_id * ID_STRIDE + ID_BASE
    return low, low + ids_per_chip - 1


def ids_per_chip_for(model: str) -> int:
    """Id range size by chip family, also for models the catalog lacks."""
    return IDS_PER_PHY_310P if normalize_model(model).startswith("310P") else IDS_PER_PHY_TRAINING


def _t(name: str, aicore: int, memory_gb: int, aicpu: int, media: int) -> TemplateSpec:
    return TemplateSpec(
        name=name, aicore=aicore, memory_mb=memory_gb * GB, aicpu=aicpu, media=media
    )


# 910B media: 9 VPC per chip from the 910B4 sample; per-template VPC of
# vir10_3c_16g (4) and vir05_1c_8g (2) from the same sample. The rest inferred.
_910B_MEDIA = 9

_910B3 = ChipModel(
    name="910B3",
    aicore=20,
    memory_mb=64 * GB,
    aicpu=7,
    media=_910B_MEDIA,
    ids_per_chip=IDS_PER_PHY_TRAINING,
    templates=(
        _t("vir05_1c_16g", 5, 16, 1, 2),  # media inferred (as vir05_1c_8g)
        _t("vir10_3c_32g", 10, 32, 3, 4),  # media inferred (as vir10_3c_16g)
    ),
)

_910B4 = ChipModel(
    name="910B4",
    aicore=20,
    memory_mb=32 * GB,
    aicpu=7,
    media=_910B_MEDIA,
    ids_per_chip=IDS_PER_PHY_TRAINING,
    templates=(
        _t("vir05_1c_8g", 5, 8, 1, 2),
        _t("vir10_3c_16g", 10, 16, 3, 4),
        _t("vir10_4c_16g_m", 10, 16, 4, _910B_MEDIA),  # all media: one per chip
        _t("vir10_3c_16g_nm", 10, 16, 3, 0),  # no media
    ),
)


def _910b_12(name: str) -> ChipModel:
    return ChipModel(
        name=name,
        aicore=24,
        memory_mb=64 * GB,
        aicpu=7,  # inferred
        media=_910B_MEDIA,  # inferred
        ids_per_chip=IDS_PER_PHY_TRAINING,
        templates=(
            _t("vir03_1c_8g", 3, 8, 1, 1),  # media inferred
            _t("vir06_1c_16g", 6, 16, 1, 2),  # media inferred
            _t("vir12_3c_32g", 12, 32, 3, 4),  # media inferred
        ),
    )


def _910(name: str, aicore: int) -> ChipModel:
    # Memory, AICPU and media of the 910 templates are inferred: memory and
    # media scale with AICore (1 GB and 1/2 unit per core), AICPU as on 910B.
    return ChipModel(
        name=name,
        aicore=aicore,
        memory_mb=32 * GB,
        aicpu=14,
        media=16,  # inferred
        ids_per_chip=IDS_PER_PHY_TRAINING,
        templates=(
            _t("vir02", 2, 2, 1, 1),
            _t("vir04", 4, 4, 1, 2),
            _t("vir08", 8, 8, 3, 4),
            _t("vir16", 16, 16, 7, 8),
        ),
    )


# 310P3 media: 8 units (inferred), one per AICore; the _dvpp template takes
# all of them and the _ndvpp one none, so they pair up to fill a chip.
_310P3 = ChipModel(
    name="310P3",
    aicore=8,
    memory_mb=24 * GB,
    aicpu=7,
    media=8,
    ids_per_chip=IDS_PER_PHY_310P,
    templates=(
        _t("vir01", 1, 3, 1, 1),
        _t("vir02", 2, 6, 2, 2),
        _t("vir02_1c", 2, 6, 1, 2),
        _t("vir04", 4, 12, 4, 4),
        _t("vir04_3c", 4, 12, 3, 4),
        _t("vir04_3c_ndvpp", 4, 12, 3, 0),
        _t("vir04_4c_dvpp", 4, 12, 4, 8),
    ),
)

CATALOG: Mapping[str, ChipModel] = {
    m.name: m
    for m in (
        _910B3,
        _910B4,
        _910b_12("910B1"),
        _910b_12("910B2"),
        _910("910", 32),
        _910("910ProB", 30),
        _310P3,
    )
}

# Names the driver prints for 910 training chips with 32 AICore.
_ALIASES: Mapping[str, str] = {"910A": "910", "910ProA": "910", "910PremiumA": "910"}


def normalize_model(chip_name: str) -> str:
    """'Ascend 910B3' / 'Ascend910B3' / '910B3' -> '910B3'."""
    name = chip_name.strip()
    if name.lower().startswith("ascend"):
        name = name[len("ascend") :].strip()
    return name


def find_model(chip_name: str) -> ChipModel | None:
    name = normalize_model(chip_name)
    name = _ALIASES.get(name, name)
    if name in CATALOG:
        return CATALOG[name]
    folded = {k.lower(): v for k, v in CATALOG.items()}
    return folded.get(name.lower())


def known_models() -> list[str]:
    return sorted(CATALOG)


@dataclass(frozen=True)
class Usage:
    aicore: int = 0
    memory_mb: int = 0
    aicpu: int = 0
    media: int = 0

    @staticmethod
    def of(templates: Iterable[TemplateSpec]) -> Usage:
        total = Usage()
        for t in templates:
            total = Usage(
                total.aicore + t.aicore,
                total.memory_mb + t.memory_mb,
                total.aicpu + t.aicpu,
                total.media + t.media,
            )
        return total


def capacity_failure(model: ChipModel, physical_id: int, used: Usage, need: TemplateSpec) -> str:
    """The kernel's message for the first resource `need` does not fit in, or
    "" if it fits. Only the AICore text is the kernel's verbatim; the others
    follow the same pattern."""
    checks = (
        ("aicore num", "core_need", need.aicore, used.aicore, model.aicore),
        ("memory size", "mem_need", need.memory_mb, used.memory_mb, model.memory_mb),
        ("aicpu num", "aicpu_need", need.aicpu, used.aicpu, model.aicpu),
        ("media num", "media_need", need.media, used.media, model.media),
    )
    for what, key, want, have, total in checks:
        if have + want > total:
            return (
                f"check {what} failed, phy_id:{physical_id}, {key}:{want}, "
                f"used:{have}, total:{total}"
            )
    return ""
