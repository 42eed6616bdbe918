"""The write-cost benchmark's shapes say the same but for where the
templates are: per chip and per model offer every chip alike, none offers
nothing, and each pair differs in one vNPU so that every write changes."""

from __future__ import annotations

from pathlib import Path

from bench import writecost

from vnpu_common.wire.models import VNPUNodeStatus


def _offers(raw: dict[str, object]) -> dict[int, list[str]]:
    status = VNPUNodeStatus.model_validate(raw)
    return {c.index: [t.name for t in status.chip_templates(c)] for c in status.chips}


def test_shapes_differ_only_in_where_the_templates_are(tmp_path: Path) -> None:
    shapes = writecost.statuses(tmp_path)
    per_chip, per_model, bare = (shapes[s] for s in writecost.SHAPES)
    assert all("templates" in chip for chip in per_chip[0]["chips"])
    assert not per_chip[0].get("models")
    assert all("templates" not in chip for chip in per_model[0]["chips"])
    offers = _offers(per_model[0])
    assert len(offers) == 8
    assert all(offers.values())
    assert _offers(per_chip[0]) == offers
    assert all(not t for t in _offers(bare[0]).values())
    for first, second in shapes.values():
        assert first != second
        assert first["vnpuCount"] == 0
        assert second["vnpuCount"] == 1
