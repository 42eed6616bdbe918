"""The chart's pre-delete hook script (charts/vnpu-operator/files/pre_delete.py): its
names are the operator's, and the patch it sends a Node removes exactly the vNPU
resources the operator advertises. The plane test in tests/integration/
test_chart_release.py runs it under `helm uninstall`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from vnpu_common.wire import names

SCRIPT = Path(__file__).resolve().parents[3] / "charts/vnpu-operator/files/pre_delete.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pre_delete", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_its_names_are_the_operators(script: ModuleType) -> None:
    assert f"/apis/{names.API_VERSION}/{names.ALLOCATION_PLURAL}" == script.ALLOCATIONS
    assert set(script.RESOURCES) == {names.RES_AICORE, names.RES_MEMORY_MB, names.RES_VNPUS}


def test_the_node_patch_removes_ours_only(script: ModuleType) -> None:
    ours = {names.RES_AICORE: "20", names.RES_MEMORY_MB: "65536", names.RES_VNPUS: "16"}
    node = {
        "status": {
            "capacity": {"cpu": "8", **ours},
            "allocatable": {"cpu": "8", names.RES_AICORE: "20"},
        }
    }
    assert script.node_patch(node) == {
        "status": {
            "capacity": dict.fromkeys(ours),
            "allocatable": {names.RES_AICORE: None},
        }
    }
    assert script.node_patch({"status": {"capacity": {"cpu": "8"}}}) is None
    assert script.node_patch({}) is None
