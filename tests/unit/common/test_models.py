"""Validation of the API models: what the CRD enforces, Python enforces too."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from vnpu_common.wire import names
from vnpu_common.wire.models import (
    Condition,
    VNPUAllocation,
    VNPUAllocationSpec,
    VNPUNodeStatus,
    find_condition,
    set_condition,
)

GOOD_SPEC = {
    "podName": "train-0",
    "podUID": "0b7c2e4c-3f1a-4b2e-9a51-1f6f0b0d9a11",
    "nodeName": "npu-node-1",
    "chip": 0,
    "template": "vir05_1c_16g",
    "vnpuId": 100,
}


def test_spec_parses_wire_names_and_dumps_them_back() -> None:
    spec = VNPUAllocationSpec.model_validate(GOOD_SPEC)
    assert spec.pod_uid == GOOD_SPEC["podUID"]
    assert spec.vnpu_id == 100
    assert spec.to_api() == GOOD_SPEC


@pytest.mark.parametrize(
    "template",
    ["vir05_1c_16g", "vir10_3c_32g", "vir01", "vir02_1c", "vir10_4c_16g_m", "vir04_3c_ndvpp"],
)
def test_real_template_names_are_accepted(template: str) -> None:
    VNPUAllocationSpec.model_validate({**GOOD_SPEC, "template": template})


@pytest.mark.parametrize(
    "template", ["", "vir5", "VIR05", "vir05-1c", "vir05_1C_16g", "foo", "vir05_", "v" * 40]
)
def test_bad_template_names_are_rejected(template: str) -> None:
    with pytest.raises(ValidationError, match="template"):
        VNPUAllocationSpec.model_validate({**GOOD_SPEC, "template": template})


@pytest.mark.parametrize(("vnpu_id", "ok"), [(99, False), (100, True), (1123, True), (1124, False)])
def test_vnpu_id_range_is_the_drivers(vnpu_id: int, ok: bool) -> None:
    data = {**GOOD_SPEC, "vnpuId": vnpu_id}
    if ok:
        assert VNPUAllocationSpec.model_validate(data).vnpu_id == vnpu_id
    else:
        with pytest.raises(ValidationError, match="vnpuId"):
            VNPUAllocationSpec.model_validate(data)


def test_negative_chip_is_rejected() -> None:
    with pytest.raises(ValidationError, match="chip"):
        VNPUAllocationSpec.model_validate({**GOOD_SPEC, "chip": -1})


@pytest.mark.parametrize("missing", sorted(GOOD_SPEC))
def test_every_spec_field_is_required(missing: str) -> None:
    data = {k: v for k, v in GOOD_SPEC.items() if k != missing}
    with pytest.raises(ValidationError, match=missing):
        VNPUAllocationSpec.model_validate(data)


def test_condition_shape_follows_metav1() -> None:
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    good = {
        "type": "Ready",
        "status": "True",
        "reason": "Created",
        "message": "",
        "lastTransitionTime": ts,
    }
    assert Condition.model_validate(good).to_api()["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    with pytest.raises(ValidationError):
        Condition.model_validate({**good, "status": "yes"})
    with pytest.raises(ValidationError):
        Condition.model_validate({**good, "reason": "has space"})
    with pytest.raises(ValidationError):
        Condition.model_validate({k: v for k, v in good.items() if k != "lastTransitionTime"})


def test_set_condition_keeps_transition_time_when_status_is_unchanged() -> None:
    conds = set_condition([], names.COND_READY, "False", "Creating", "creating vNPU")
    first = find_condition(conds, names.COND_READY)
    assert first is not None
    old = first.model_copy(update={"last_transition_time": datetime(2020, 1, 1, tzinfo=UTC)})
    same = set_condition([old], names.COND_READY, "False", "StillCreating")
    changed = set_condition([old], names.COND_READY, "True", "Created")
    assert same[0].last_transition_time == old.last_transition_time
    assert same[0].reason == "StillCreating"
    assert changed[0].last_transition_time > old.last_transition_time
    assert len(set_condition(changed, names.COND_HEALTHY, "True", "Ok")) == 2


def test_full_object_roundtrip_ignores_unknown_fields() -> None:
    obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {"name": "a", "namespace": "ns", "managedFields": [{}], "labels": {"x": "y"}},
        "spec": GOOD_SPEC,
        "status": {"phase": "Ready", "devicePath": "/dev/vdavinci100", "newField": 1},
    }
    alloc = VNPUAllocation.model_validate(obj)
    assert alloc.status.phase == "Ready"
    assert alloc.metadata.labels == {"x": "y"}
    assert "newField" not in alloc.to_api()["status"]


def test_node_status_summary_alias() -> None:
    status = VNPUNodeStatus(chip_count=2, vnpu_count=3, free_aicore=7)
    assert status.to_api()["freeAICore"] == 7
