"""mutate_pod: the ops are right, apply cleanly (jsonpatch, an independent RFC 6902
implementation) and are idempotent."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest

from vnpu_common.wire import names
from vnpu_common.wire.patches import json_pointer
from vnpu_operator.admission import AdmissionError, AnnotationError, mutate_pod
from vnpu_operator.admission.mutation import (
    VISIBLE_DEVICES_FIELD_PATH,
    _env_ops,
    device_env,
    device_indexes_env,
    mutate_ephemeral,
    no_devices_env,
    no_vnpu_specs_env,
    runtime_options_env,
    visible_devices_env,
)
from vnpu_operator.annotations import ContainerRef

PodFactory = Callable[..., dict[str, Any]]

VISIBLE = visible_devices_env()
RUNTIME = runtime_options_env()
NO_SPECS = no_vnpu_specs_env()
# What every container of a vNPU pod ends with: its vNPUs, or none.
INDEXES = device_indexes_env(1)  # a pod of one vNPU: CANN's device 0
OURS = [VISIBLE, RUNTIME, NO_SPECS, INDEXES]
NONE = [no_devices_env(), RUNTIME, NO_SPECS]


def _apply(pod: dict[str, Any]) -> dict[str, Any]:
    """Mutates `pod` twice; the second pass must find nothing left to do."""
    ops = mutate_pod(pod)
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    assert mutate_pod(patched) == []
    assert jsonpatch.apply_patch(patched, mutate_pod(patched)) == patched
    return patched


def _env(pod: dict[str, Any], field: str, index: int) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = pod["spec"][field][index].get("env", [])
    return env


def test_env_values_are_what_the_ascend_runtime_reads() -> None:
    assert VISIBLE == {
        "name": "ASCEND_VISIBLE_DEVICES",
        "valueFrom": {
            "fieldRef": {
                "apiVersion": "v1",
                "fieldPath": "metadata.annotations['vnpu.io/visible-devices']",
            }
        },
    }
    assert RUNTIME == {"name": "ASCEND_RUNTIME_OPTIONS", "value": "VIRTUAL"}
    assert NO_SPECS == {"name": "ASCEND_VNPU_SPECS", "value": ""}
    assert NONE[0] == {"name": "ASCEND_VISIBLE_DEVICES", "value": ""}
    assert f"metadata.annotations['{names.ANN_VISIBLE_DEVICES}']" == VISIBLE_DEVICES_FIELD_PATH


def test_json_pointer_escapes_tilde_then_slash() -> None:
    assert json_pointer("metadata", "annotations", "vnpu.io/visible-devices") == (
        "/metadata/annotations/vnpu.io~1visible-devices"
    )
    assert json_pointer("a~/b", 0, "-") == "/a~0~1b/0/-"


def test_plain_pod_gets_gate_finalizer_and_env(make_pod: PodFactory) -> None:
    pod = make_pod()
    assert mutate_pod(pod) == [
        {"op": "add", "path": "/metadata/labels", "value": {"vnpu.io/managed": "true"}},
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "vnpu.io/allocation"}]},
        {"op": "add", "path": "/metadata/finalizers", "value": ["vnpu.io/release"]},
        {"op": "add", "path": "/spec/containers/0/env", "value": OURS},
    ]
    patched = _apply(pod)
    assert patched["spec"]["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]
    assert patched["metadata"]["finalizers"] == [names.POD_FINALIZER]


def test_pod_not_asking_is_untouched(make_pod: PodFactory) -> None:
    assert mutate_pod(make_pod(template=None)) == []


def test_existing_gates_finalizers_and_env_are_kept(make_pod: PodFactory) -> None:
    app = {"name": "app", "env": [{"name": "HOME", "value": "/root"}]}
    pod = make_pod(containers=[app], schedulingGates=[{"name": "other.io/gate"}])
    pod["metadata"]["finalizers"] = ["other.io/keep"]
    patched = _apply(pod)
    assert patched["spec"]["schedulingGates"] == [
        {"name": "other.io/gate"},
        {"name": names.SCHEDULING_GATE},
    ]
    assert patched["metadata"]["finalizers"] == ["other.io/keep", names.POD_FINALIZER]
    assert _env(patched, "containers", 0) == [{"name": "HOME", "value": "/root"}, *OURS]


def test_already_gated_pod_gets_no_second_gate(make_pod: PodFactory) -> None:
    pod = make_pod(schedulingGates=[{"name": names.SCHEDULING_GATE}])
    pod["metadata"]["finalizers"] = [names.POD_FINALIZER]
    pod["metadata"]["labels"] = {"app": "x"}
    ops = mutate_pod(pod)
    assert [op["path"] for op in ops] == [
        "/metadata/labels/vnpu.io~1managed",
        "/spec/containers/0/env",
    ]
    assert _apply(pod)["metadata"]["labels"] == {"app": "x", names.LABEL_MANAGED: "true"}


def test_null_lists_are_created(make_pod: PodFactory) -> None:
    pod = make_pod(containers=[{"name": "app", "env": None}], schedulingGates=None)
    pod["metadata"]["finalizers"] = None
    patched = _apply(pod)
    assert patched["spec"]["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]
    assert _env(patched, "containers", 0) == OURS


def test_init_containers_get_env_by_default(make_pod: PodFactory) -> None:
    patched = _apply(make_pod(containers=["a", "b"], init_containers=["setup"]))
    for field, index in [("initContainers", 0), ("containers", 0), ("containers", 1)]:
        assert _env(patched, field, index) == OURS


def test_only_named_containers_get_env(make_pod: PodFactory) -> None:
    pod = make_pod(
        {names.ANN_CONTAINERS: "trainer,setup"},
        containers=["sidecar", "trainer"],
        init_containers=["setup", "fetch"],
    )
    patched = _apply(pod)
    assert _env(patched, "containers", 1) == OURS
    assert _env(patched, "initContainers", 0) == OURS
    # Left out, not left alone: an empty device list, or their image could name any.
    assert _env(patched, "containers", 0) == NONE
    assert _env(patched, "initContainers", 1) == NONE


def test_user_values_of_system_env_are_replaced(make_pod: PodFactory) -> None:
    env = [
        {"name": "ASCEND_RUNTIME_OPTIONS", "value": "NODRV"},
        {"name": "KEEP", "value": "1"},
        {"name": "ASCEND_VISIBLE_DEVICES", "value": "0,1,2,3"},
    ]
    pod = make_pod(containers=[{"name": "app", "env": env}])
    assert mutate_pod(pod)[3:] == [
        {"op": "replace", "path": "/spec/containers/0/env/2", "value": VISIBLE},
        {"op": "replace", "path": "/spec/containers/0/env/0", "value": RUNTIME},
        {"op": "add", "path": "/spec/containers/0/env/-", "value": NO_SPECS},
        {"op": "add", "path": "/spec/containers/0/env/-", "value": INDEXES},
    ]
    assert _env(_apply(pod), "containers", 0) == [
        RUNTIME, {"name": "KEEP", "value": "1"}, VISIBLE, NO_SPECS, INDEXES,
    ]  # fmt: skip


def test_duplicate_system_env_entries_are_removed(make_pod: PodFactory) -> None:
    env = [
        {"name": "ASCEND_VISIBLE_DEVICES", "value": "0"},
        {"name": "A", "value": "a"},
        {"name": "ASCEND_VISIBLE_DEVICES", "value": "1"},
        {"name": "ASCEND_RUNTIME_OPTIONS", "value": "X"},
        {"name": "ASCEND_VISIBLE_DEVICES", "value": "2"},
        {"name": "ASCEND_RUNTIME_OPTIONS", "value": "VIRTUAL"},
    ]
    pod = make_pod(containers=[{"name": "app", "env": env}])
    assert _env(_apply(pod), "containers", 0) == [
        VISIBLE, {"name": "A", "value": "a"}, RUNTIME, NO_SPECS, INDEXES,
    ]  # fmt: skip


def test_defaulted_field_ref_counts_as_ours(make_pod: PodFactory) -> None:
    # The API server may hand us back the env without apiVersion or with empty
    # fields; that is still our value and must not be rewritten on reinvocation.
    visible = {
        "name": "ASCEND_VISIBLE_DEVICES",
        "value": "",
        "valueFrom": {"fieldRef": {"fieldPath": VISIBLE_DEVICES_FIELD_PATH}},
    }
    pod = make_pod(
        containers=[
            {"name": "app", "env": [visible, RUNTIME, {"name": "ASCEND_VNPU_SPECS"}, INDEXES]}
        ],
        schedulingGates=[{"name": names.SCHEDULING_GATE}],
    )
    pod["metadata"]["finalizers"] = [names.POD_FINALIZER]
    pod["metadata"]["labels"] = {names.LABEL_MANAGED: "true"}
    assert mutate_pod(pod) == []


def test_user_set_visible_devices_annotation_is_removed(make_pod: PodFactory) -> None:
    pod = make_pod({names.ANN_VISIBLE_DEVICES: "100,101"})
    ops = mutate_pod(pod)
    assert ops[0] == {"op": "remove", "path": "/metadata/annotations/vnpu.io~1visible-devices"}
    patched = _apply(pod)
    assert names.ANN_VISIBLE_DEVICES not in patched["metadata"]["annotations"]
    assert patched["metadata"]["annotations"][names.ANN_TEMPLATE] == "vir05_1c_16g"


def test_mutation_does_not_modify_its_input(make_pod: PodFactory) -> None:
    pod = make_pod(init_containers=["setup"])
    before = copy.deepcopy(pod)
    mutate_pod(pod)
    assert pod == before


def test_bad_annotations_raise_annotation_error(make_pod: PodFactory) -> None:
    with pytest.raises(AnnotationError, match=re.escape('vnpu.io/count "x" is not a whole number')):
        mutate_pod(make_pod({names.ANN_COUNT: "x"}))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"schedulingGates": {"name": "x"}}, "spec.schedulingGates is not a list"),
        ({"containers": [{"name": "app", "env": "A=1"}]}, "spec.containers[0].env is not a list"),
    ],
)
def test_wrong_shapes_raise_admission_error(
    make_pod: PodFactory, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(AdmissionError, match=re.escape(message)):
        mutate_pod(make_pod(**spec))


def test_pod_without_spec_raises_admission_error() -> None:
    pod = {"metadata": {"annotations": {names.ANN_TEMPLATE: "vir01"}}}
    with pytest.raises(AdmissionError, match="pod has no metadata or no spec"):
        mutate_pod(pod)


def test_finalizers_not_a_list_raise(make_pod: PodFactory) -> None:
    pod = make_pod()
    pod["metadata"]["finalizers"] = "vnpu.io/release"
    with pytest.raises(AdmissionError, match=r"metadata\.finalizers is not a list"):
        mutate_pod(pod)


def test_runtime_class_is_set_on_a_pod_naming_none(make_pod: PodFactory) -> None:
    pod = make_pod()
    ops = mutate_pod(pod, "ascend")
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "ascend"} in ops
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    assert patched["spec"]["runtimeClassName"] == "ascend"
    # Reinvoked on its own result, the webhook has nothing left to add.
    assert mutate_pod(patched, "ascend") == []


def test_runtime_class_named_by_the_pod_is_kept(make_pod: PodFactory) -> None:
    pod = make_pod(runtimeClassName="kata")
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, mutate_pod(pod, "ascend"))
    assert patched["spec"]["runtimeClassName"] == "kata"


def test_no_runtime_class_without_the_setting_or_a_vnpu_request(make_pod: PodFactory) -> None:
    assert not [op for op in mutate_pod(make_pod()) if "runtimeClassName" in op["path"]]
    assert mutate_pod(make_pod(template=None), "ascend") == []


@pytest.mark.parametrize("field", ["containers", "initContainers"])
def test_a_vnpu_specs_of_the_pods_own_is_refused_in_any_container(
    make_pod: PodFactory, field: str
) -> None:
    specs = {"name": "ASCEND_VNPU_SPECS", "value": "vir05_1c_16g"}
    pod = make_pod({names.ANN_CONTAINERS: "app"}, containers=["app"],
                   init_containers=["setup"])  # fmt: skip
    pod["spec"][field][0]["env"] = [specs]
    with pytest.raises(AdmissionError, match=rf"spec\.{field}\[0\]\.env ASCEND_VNPU_SPECS: no pod"):
        mutate_pod(pod)
    # Our own entry, empty, passes (the API server reinvokes the webhook on its result).
    pod["spec"][field][0]["env"] = [NO_SPECS]
    assert _apply(pod)


def test_ephemeral_containers_added_later_get_no_devices(make_pod: PodFactory) -> None:
    pod = _apply(make_pod())
    debug = {"name": "debug", "image": "busybox", "env": [{"name": "ASCEND_VISIBLE_DEVICES",
                                                          "value": "101"}]}  # fmt: skip
    earlier = {"name": "earlier", "image": "busybox"}
    old = copy.deepcopy(pod)
    old["spec"]["ephemeralContainers"] = [earlier]
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append(debug)
    ops = mutate_ephemeral(new, old)
    # The earlier one is immutable now: only the new one is touched.
    assert {op["path"].split("/")[3] for op in ops} == {"1"}
    patched: dict[str, Any] = jsonpatch.apply_patch(new, ops)
    assert _env(patched, "ephemeralContainers", 1) == NONE
    assert mutate_ephemeral(patched, old) == []
    # A pod that asks for no vNPUs is not ours to change.
    plain = make_pod(template=None)
    plain["spec"]["ephemeralContainers"] = [debug]
    assert mutate_ephemeral(plain, None) == []
    # One asking the runtime for a vNPU of its own is refused.
    specs = {**earlier, "name": "specs", "env": [{"name": "ASCEND_VNPU_SPECS", "value": "x"}]}
    with pytest.raises(AdmissionError, match="ephemeralContainers"):
        mutate_ephemeral({**new, "spec": {**new["spec"], "ephemeralContainers": [specs]}}, old)


# -- the indexes CANN knows the container's vNPUs by (docs/USAGE.md) -----------


def test_indexes_are_0_to_n_minus_1_whatever_the_ids() -> None:
    """A container holding vNPUs 116 and 101 has CANN devices 0 and 1; the ids
    themselves name none (ASCEND_RT_VISIBLE_DEVICES takes indexes)."""
    assert device_indexes_env(1) == {"name": "ASCEND_RT_VISIBLE_DEVICES", "value": "0"}
    assert device_indexes_env(3) == {"name": "ASCEND_RT_VISIBLE_DEVICES", "value": "0,1,2"}


def test_with_the_pods_count_a_vnpu_container_also_gets_its_indexes() -> None:
    assert device_env(True, 2) == [VISIBLE, RUNTIME, NO_SPECS, device_indexes_env(2)]
    # Without vNPUs it has no device to index; without a count, what it had.
    assert device_env(False, 2) == NONE
    assert device_env(True) == [VISIBLE, RUNTIME, NO_SPECS]


def test_an_index_list_the_user_set_is_replaced_by_ours() -> None:
    """A vNPU id copied from ASCEND_VISIBLE_DEVICES (or a bare-metal list) would
    make CANN refuse the device: the container's own indexes win, once."""
    env = [
        {"name": "ASCEND_RT_VISIBLE_DEVICES", "value": "116"},
        {"name": "A", "value": "a"},
        {"name": "ASCEND_RT_VISIBLE_DEVICES", "value": "4,5"},
    ]
    pod = {"spec": {"containers": [{"name": "app", "env": env}]}}
    wanted = device_env(True, 2)
    ops = _env_ops(ContainerRef("containers", 0, "app"), env, wanted)
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    got = _env(patched, "containers", 0)
    assert [e for e in got if e["name"] == "ASCEND_RT_VISIBLE_DEVICES"] == [
        {"name": "ASCEND_RT_VISIBLE_DEVICES", "value": "0,1"}
    ]
    assert _env_ops(ContainerRef("containers", 0, "app"), got, wanted) == []
