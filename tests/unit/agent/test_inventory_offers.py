"""A VNPUNode lists each chip model's templates once (status.models); a chip
lists its own only where they differ from its model's, and [] where it offers
none. Read back, every chip offers exactly what the driver listed for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vnpu_agent.drivers.base import VNPU, ChipInfo, TemplateSpec
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.inventory import build_status
from vnpu_common.wire.models import VNPUNodeStatus


def _status(chips: list[ChipInfo], templates: dict[int, list[TemplateSpec]]) -> dict[str, Any]:
    return build_status(
        driver="sim", chips=chips, templates=templates, vnpus={}, allocations=[], conditions=[]
    )


def _offered(status: dict[str, Any]) -> dict[int, list[tuple[str, int, int, int, int]]]:
    parsed = VNPUNodeStatus.model_validate(status)
    return {
        chip.index: [(t.name, t.aicore, t.memory_mb, t.aicpu, t.media)
                     for t in parsed.chip_templates(chip)]
        for chip in parsed.chips
    }  # fmt: skip


def _listed(templates: dict[int, list[TemplateSpec]]) -> dict[int, list[tuple[Any, ...]]]:
    return {i: [(t.name, t.aicore, t.memory_mb, t.aicpu, t.media) for t in ts]
            for i, ts in templates.items()}  # fmt: skip


def _sim(tmp_path: Path, layout: str) -> tuple[list[ChipInfo], dict[int, list[TemplateSpec]]]:
    sim = SimDriver(tmp_path / "sim.json", layout)
    chips = sim.list_chips()
    return chips, {c.index: sim.list_templates(c.index) for c in chips}


def test_each_models_list_is_written_once_and_no_chip_repeats_it(tmp_path: Path) -> None:
    chips, templates = _sim(tmp_path, "910B3=4,310P3=4")
    status = _status(chips, templates)
    assert [m["model"] for m in status["models"]] == ["310P3", "910B3"]
    assert all("templates" not in chip for chip in status["chips"])
    assert _offered(status) == _listed(templates)


def test_a_chip_unlike_its_model_lists_its_own(tmp_path: Path) -> None:
    chips, templates = _sim(tmp_path, "910B3=3")
    # Chip 1 offers one template fewer; chip 2 one of another size.
    templates[1] = templates[1][1:]
    first = templates[2][0]
    templates[2] = [TemplateSpec(first.name, first.aicore, first.memory_mb // 2, first.aicpu,
                                 first.media), *templates[2][1:]]  # fmt: skip
    status = _status(chips, templates)
    own = {chip["index"]: chip.get("templates") for chip in status["chips"]}
    assert own[0] is None
    assert own[1] is not None
    assert own[2] is not None
    assert _offered(status) == _listed(templates)


def test_a_chip_that_offers_nothing_says_so_rather_than_taking_its_models(
    tmp_path: Path,
) -> None:
    chips, templates = _sim(tmp_path, "910B3=2")
    templates[1] = []
    status = _status(chips, templates)
    assert status["chips"][1]["templates"] == []
    assert _offered(status) == {0: _listed(templates)[0], 1: []}


def test_a_model_with_no_list_offers_nothing() -> None:
    parsed = VNPUNodeStatus.model_validate(
        {"models": [{"model": "910B3", "templates": [
            {"name": "vir05_1c_16g", "aicore": 5, "memoryMb": 16384, "aicpu": 1}]}],
         "chips": [_chip_raw(0, "910B3"), _chip_raw(1, "310P3")]}
    )  # fmt: skip
    assert [t.name for t in parsed.chip_templates(parsed.chips[0])] == ["vir05_1c_16g"]
    assert parsed.chip_templates(parsed.chips[1]) == []
    parsed.resolve_templates()
    assert [len(c.templates or ()) for c in parsed.chips] == [1, 0]
    assert parsed.chips[1].templates == []


def _chip_raw(index: int, model: str) -> dict[str, Any]:
    return {
        "index": index, "physicalId": index, "cardId": index, "deviceId": 0, "model": model,
        "health": "Healthy", "aicoreTotal": 20, "aicoreFree": 20, "memoryTotalMb": 65536,
        "memoryFreeMb": 65536, "aicpuTotal": 7, "aicpuFree": 7, "vnpuIdMin": 100 + 16 * index,
        "vnpuIdMax": 115 + 16 * index,
    }  # fmt: skip


def test_each_chip_lists_its_own_vnpus_by_id_with_their_owners(tmp_path: Path) -> None:
    """The vNPUs are grouped by chip in one pass (a pass per chip over all of
    them grew with chips x vNPUs): whatever order the view holds them in,
    each chip lists its own, by id; one on a chip the driver no longer lists
    is on none."""
    chips, templates = _sim(tmp_path, "910B3=2,310P3=1")
    on = {101: 1, 100: 0, 132: 2, 117: 1, 102: 0, 999: 7}
    vnpus = {i: VNPU(id=i, chip=c, template="vir01", in_use=i == 117) for i, c in on.items()}
    owner = {"metadata": {"namespace": "ns", "name": "a"}, "spec": {"vnpuId": 117, "podUID": "u"}}
    status = build_status(
        driver="sim", chips=chips, templates=templates, vnpus=vnpus, allocations=[owner],
        conditions=[],
    )  # fmt: skip
    listed = {c["index"]: [v["id"] for v in c["vnpus"]] for c in status["chips"]}
    assert listed == {0: [100, 102], 1: [101, 117], 2: [132]}
    assert status["vnpuCount"] == 5
    assert status["chips"][1]["vnpus"][1] == {
        "id": 117, "template": "vir01", "inUse": True, "allocation": "ns/a", "podUID": "u",
    }  # fmt: skip
    assert status["chips"][0]["vnpus"][0] == {"id": 100, "template": "vir01", "inUse": False}
