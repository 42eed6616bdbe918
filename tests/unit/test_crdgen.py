"""The CRD YAML is generated from the models and must be structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vnpu_common import names
from vnpu_common.api import crdgen

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


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
