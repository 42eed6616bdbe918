"""The template catalog: totals, templates, coexistence and id ranges."""

from __future__ import annotations

import re

import pytest

from vnpu_agent.drivers.base import TemplateSpec
from vnpu_agent.drivers.catalog import (
    CATALOG,
    Usage,
    capacity_failure,
    find_model,
    id_range,
    ids_per_chip_for,
    normalize_model,
)
from vnpu_common.wire import names

GB = 1024


def fits(model_name: str, *templates: str) -> bool:
    """Whether the templates, created one after another, all fit on one chip."""
    model = CATALOG[model_name]
    used: list[TemplateSpec] = []
    for name in templates:
        spec = model.template(name)
        assert spec is not None, name
        if capacity_failure(model, 0, Usage.of(used), spec):
            return False
        used.append(spec)
    return True


@pytest.mark.parametrize(
    ("model", "aicore", "memory_gb", "aicpu"),
    [
        ("910B3", 20, 64, 7),
        ("910B4", 20, 32, 7),
        ("910B1", 24, 64, 7),
        ("910B2", 24, 64, 7),
        ("910", 32, 32, 14),
        ("910ProB", 30, 32, 14),
        ("310P3", 8, 24, 7),
    ],
)
def test_chip_totals(model: str, aicore: int, memory_gb: int, aicpu: int) -> None:
    chip = CATALOG[model]
    assert (chip.aicore, chip.memory_mb, chip.aicpu) == (aicore, memory_gb * GB, aicpu)


@pytest.mark.parametrize(
    ("model", "template", "aicore", "memory_gb", "aicpu"),
    [
        ("910B3", "vir05_1c_16g", 5, 16, 1),
        ("910B3", "vir10_3c_32g", 10, 32, 3),
        ("910B4", "vir05_1c_8g", 5, 8, 1),
        ("910B4", "vir10_3c_16g", 10, 16, 3),
        ("910B4", "vir10_4c_16g_m", 10, 16, 4),
        ("910B4", "vir10_3c_16g_nm", 10, 16, 3),
        ("910B1", "vir06_1c_16g", 6, 16, 1),
        ("910B2", "vir12_3c_32g", 12, 32, 3),
        ("910B2", "vir03_1c_8g", 3, 8, 1),
        ("910", "vir16", 16, 16, 7),
        ("310P3", "vir01", 1, 3, 1),
        ("310P3", "vir02", 2, 6, 2),
        ("310P3", "vir02_1c", 2, 6, 1),
        ("310P3", "vir04", 4, 12, 4),
        ("310P3", "vir04_3c", 4, 12, 3),
        ("310P3", "vir04_3c_ndvpp", 4, 12, 3),
        ("310P3", "vir04_4c_dvpp", 4, 12, 4),
    ],
)
def test_templates_match_the_table(
    model: str, template: str, aicore: int, memory_gb: int, aicpu: int
) -> None:
    spec = CATALOG[model].template(template)
    assert spec is not None
    assert (spec.aicore, spec.memory_mb, spec.aicpu) == (aicore, memory_gb * GB, aicpu)


def test_910_template_aicore_is_the_number_in_the_name() -> None:
    for spec in CATALOG["910"].templates:
        assert spec.aicore == int(spec.name[3:5])


def test_every_template_name_is_valid_on_the_wire() -> None:
    for model in CATALOG.values():
        for spec in model.templates:
            assert re.match(names.TEMPLATE_PATTERN, spec.name)
            assert len(spec.name) <= names.TEMPLATE_MAX_LEN
            assert spec.media <= model.media


def test_910b3_coexistence_examples() -> None:
    assert fits("910B3", *["vir05_1c_16g"] * 4)
    assert not fits("910B3", *["vir05_1c_16g"] * 5)
    assert fits("910B3", "vir10_3c_32g", "vir10_3c_32g")
    assert not fits("910B3", "vir10_3c_32g", "vir10_3c_32g", "vir05_1c_16g")
    assert fits("910B3", "vir10_3c_32g", "vir05_1c_16g", "vir05_1c_16g")


def test_310p_fits_at_most_seven_vnpus() -> None:
    assert fits("310P3", *["vir01"] * 7)
    assert not fits("310P3", *["vir01"] * 8)  # AICPU: one each, 7 in all
    six = ["vir01"] * 6
    assert fits("310P3", *six, "vir01")
    assert fits("310P3", *six, "vir02_1c")
    assert not fits("310P3", *six, "vir02")
    assert not fits("310P3", *six, "vir04")


def test_910b4_media_template_takes_all_media() -> None:
    assert not fits("910B4", "vir10_4c_16g_m", "vir10_4c_16g_m")
    assert not fits("910B4", "vir10_4c_16g_m", "vir05_1c_8g")
    # no-media templates fill the rest of the chip beside it
    assert fits("910B4", "vir10_4c_16g_m", "vir10_3c_16g_nm")
    assert fits("910B4", "vir10_3c_16g", "vir10_3c_16g")
    assert fits("910B4", *["vir05_1c_8g"] * 4)


def test_310p_dvpp_templates_pair_up() -> None:
    assert fits("310P3", "vir04_4c_dvpp", "vir04_3c_ndvpp")
    assert not fits("310P3", "vir04_4c_dvpp", "vir04_3c")


def test_kernel_message_names_the_first_short_resource() -> None:
    model = CATALOG["910B3"]
    big = model.template("vir10_3c_32g")
    assert big is not None
    used = Usage(aicore=15, memory_mb=48 * GB, aicpu=5, media=6)
    assert capacity_failure(model, 3, used, big) == (
        "check aicore num failed, phy_id:3, core_need:10, used:15, total:20"
    )
    used = Usage(aicore=0, memory_mb=48 * GB, aicpu=0, media=0)
    assert capacity_failure(model, 0, used, big).startswith("check memory size failed, phy_id:0")
    used = Usage(aicpu=5)
    assert capacity_failure(model, 0, used, big).startswith("check aicpu num failed")
    used = Usage(media=6)
    assert capacity_failure(model, 0, used, big).startswith("check media num failed")
    assert capacity_failure(model, 0, Usage(), big) == ""


@pytest.mark.parametrize(
    ("model", "phy", "expected"),
    [
        ("910B3", 0, (100, 115)),
        ("910B3", 3, (148, 163)),
        ("910", 63, (1108, 1123)),
        ("310P3", 0, (100, 107)),
        ("310P3", 2, (132, 139)),
    ],
)
def test_id_ranges(model: str, phy: int, expected: tuple[int, int]) -> None:
    assert CATALOG[model].id_range(phy) == expected
    assert id_range(phy, ids_per_chip_for(model)) == expected


def test_id_range_rule_also_covers_models_without_a_catalog() -> None:
    assert ids_per_chip_for("Ascend 310P1") == 8
    assert ids_per_chip_for("910C") == 16


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Ascend 910B3", "910B3"),
        ("Ascend910B4", "910B4"),
        ("310p3", "310P3"),
        ("910A", "910"),
        ("Ascend 910ProA", "910"),
        ("910ProB", "910ProB"),
    ],
)
def test_model_names_as_drivers_print_them(name: str, expected: str) -> None:
    model = find_model(name)
    assert model is not None
    assert model.name == expected


def test_unknown_model() -> None:
    assert find_model("Ascend 999X") is None
    assert normalize_model("  Ascend 999X ") == "999X"
