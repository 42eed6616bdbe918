"""The CRD YAML is generated from the models and must be structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from vnpu_common.wire import crdgen, names

CRD_DIR = Path(__file__).resolve().parents[3] / "crds"


def test_checked_in_crds_match_the_models() -> None:
    drift = [
        name
        for name, text in crdgen.render_all().items()
        if not (CRD_DIR / name).exists() or (CRD_DIR / name).read_text() != text
    ]
    assert drift == [], f"crds/ drifted from the models, run `make crds`: {drift}"


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    assert crdgen.main([str(tmp_path)]) == 0
    assert crdgen.main(["--check", str(tmp_path)]) == 0
    victim = next(tmp_path.glob("*.yaml"))
    victim.write_text(victim.read_text().replace("vnpuId", "vnpuID"))
    assert crdgen.main(["--check", str(tmp_path)]) == 1


def _walk(node: Any, path: str = "$") -> list[str]:
    """Paths of schema nodes that break structural-schema rules."""
    problems: list[str] = []
    if not isinstance(node, dict):
        return problems
    for bad in ("$ref", "anyOf", "oneOf", "allOf", "title", "const", "$defs"):
        if bad in node:
            problems.append(f"{path}: has {bad}")
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: no type")
    for name, sub in node.get("properties", {}).items():
        problems += _walk(sub, f"{path}.{name}")
    if "items" in node:
        problems += _walk(node["items"], f"{path}[]")
    return problems


def test_schemas_are_structural() -> None:
    for text in crdgen.render_all().values():
        crd = yaml.safe_load(text)
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert _walk(schema) == []


def test_allocation_crd_contract() -> None:
    crd = crdgen.allocation_crd()
    assert crd["spec"]["names"]["shortNames"] == [names.ALLOCATION_SHORT]
    assert crd["spec"]["names"]["categories"] == [names.CATEGORY]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    cols = [c["name"].upper() for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert cols == ["POD", "NODE", "CHIP", "TEMPLATE", "VNPU", "PHASE", "AGE"]
    conds = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    assert conds["x-kubernetes-list-type"] == "map"
    assert conds["x-kubernetes-list-map-keys"] == ["type"]


def test_node_crd_contract() -> None:
    crd = crdgen.node_crd()
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["shortNames"] == [names.NODE_SHORT]
    version = crd["spec"]["versions"][0]
    cols = [c["name"].upper() for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert cols == ["CHIPS", "VNPUS", "FREE-AICORE", "READY", "CORDONED", "UNHEALTHY", "AGE"]
    # Only admins write the spec; the agent creates VNPUNodes without one.
    root = version["schema"]["openAPIV3Schema"]
    assert "spec" not in root.get("required", [])
    cordoned = root["properties"]["spec"]["properties"]["cordonedChips"]
    assert cordoned["x-kubernetes-list-map-keys"] == ["chip"]
    assert cordoned["items"]["required"] == ["chip", "reason"]


def _all_properties(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, sub in node.get("properties", {}).items():
        out.append((f"{path}.{name}", sub))
        out += _all_properties(sub, f"{path}.{name}")
    if "items" in node:
        out += _all_properties(node["items"], f"{path}[]")
    return out


def test_kubectl_explain_has_a_description_for_every_property() -> None:
    """Read back from the rendered YAML, as `kubectl explain` reads the CRD."""
    counted = 0
    for text in crdgen.render_all().values():
        crd = yaml.safe_load(text)
        kind = crd["spec"]["names"]["kind"]
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert schema["description"].strip()
        for path, sub in _all_properties(schema, kind):
            if path in (f"{kind}.apiVersion", f"{kind}.kind", f"{kind}.metadata"):
                # The API server documents these itself (tests/integration/test_crd_explain).
                assert set(sub) == {"type"}
                continue
            counted += 1
            assert str(sub.get("description", "")).strip(), f"{path} has no description"
    # Both CRDs together: a walk that found nothing would prove nothing.
    assert counted >= 60


def test_chip_fields_are_explained() -> None:
    """The list the issue named: every field of VNPUNode.status.chips[]."""
    crd = crdgen.node_crd()
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    chip = status["properties"]["chips"]["items"]
    assert set(chip["properties"]) >= {"index", "physicalId", "health", "aicoreFree", "vnpus"}
    for name, sub in chip["properties"].items():
        assert sub["description"].strip(), name
    assert "Phy-ID" in chip["properties"]["physicalId"]["description"]


class _Inner(BaseModel):
    """Has a docstring, so the list items are described."""

    described: int = Field(description="Says what it is.")
    bare: int


class _Outer(BaseModel):
    """The spec."""

    ok: str = Field(description="Fine.")
    naked: str
    items: list[_Inner] = Field(description="A list.")


def test_generation_fails_naming_each_undescribed_property() -> None:
    with pytest.raises(crdgen.UndescribedPropertyError) as caught:
        crdgen._crd(
            kind="Thing",
            plural="things",
            singular="thing",
            short="th",
            scope="Cluster",
            schema=crdgen._object_root(crdgen.structural(_Outer), crdgen.structural(_Inner)),
            columns=[],
            description="A thing.",
        )
    # Depth first, in kubectl explain's spelling; the described ones are not named.
    assert caught.value.paths == [
        "Thing.spec.naked",
        "Thing.spec.items[].bare",
        "Thing.status.bare",
    ]
    assert "Thing.spec.naked" in str(caught.value)
    assert "Field(description=" in str(caught.value)


def test_make_crds_refuses_an_undescribed_property(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command `make crds` runs exits 1 with the paths, writes nothing, no traceback."""
    monkeypatch.setattr(crdgen, "VNPUNodeStatus", _Outer)
    assert crdgen.main([str(tmp_path)]) == 1
    assert list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    assert err.startswith("error: CRD properties without a description")
    assert "VNPUNode.status.naked" in err
    assert "Traceback" not in err


def test_main_writes_every_directory_it_is_given(tmp_path: Path) -> None:
    """`make crds` writes crds/ and the chart's copy in one run: they cannot differ."""
    first, second = tmp_path / "crds", tmp_path / "chart" / "files" / "crds"
    assert crdgen.main([str(first), str(second)]) == 0
    names_first = sorted(p.name for p in first.glob("*.yaml"))
    assert names_first == sorted(crdgen.render_all())
    for name in names_first:
        assert (first / name).read_text() == (second / name).read_text()
    assert crdgen.main(["--check", str(first), str(second)]) == 0
    (second / names_first[0]).write_text("stale\n")
    assert crdgen.main(["--check", str(first), str(second)]) == 1
