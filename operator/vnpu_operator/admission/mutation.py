"""What the mutating webhook adds to a pod that asks for vNPUs, as RFC 6902 ops.

`mutate_pod` of an already mutated pod is empty: the API server may reinvoke
the webhook (reinvocationPolicy IfNeeded), and the validating webhook uses an
empty result as proof that the mutation is in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from vnpu_common.wire import names
from vnpu_common.wire.patches import json_pointer
from vnpu_common.wire.quantity import quantity_value
from vnpu_operator.admission.charges import Charge
from vnpu_operator.annotations import (
    AdmissionError,
    ContainerRef,
    parse_request,
    pod_containers,
    requests_vnpus,
)

JsonPatchOp = dict[str, Any]

VISIBLE_DEVICES_FIELD_PATH: Final = f"metadata.annotations['{names.ANN_VISIBLE_DEVICES}']"


def visible_devices_env() -> dict[str, Any]:
    # apiVersion spelled out: the API server defaults it, and the pod we see on
    # reinvocation must compare equal to what we wrote.
    return {
        "name": names.ENV_VISIBLE_DEVICES,
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": VISIBLE_DEVICES_FIELD_PATH}},
    }


def runtime_options_env() -> dict[str, Any]:
    return {"name": names.ENV_RUNTIME_OPTIONS, "value": names.RUNTIME_OPTIONS_VIRTUAL}


def no_devices_env() -> dict[str, Any]:
    """A container that has no vNPU: the runtime mounts none, whatever its image or an
    envFrom source says (an explicit entry beats both)."""
    return {"name": names.ENV_VISIBLE_DEVICES, "value": ""}


def no_vnpu_specs_env() -> dict[str, Any]:
    """The runtime's own vNPU creation switched off: a vNPU it made would be behind the
    ledger. Its CDI mode tries the create before it looks at VIRTUAL, so VIRTUAL alone
    does not stop it."""
    return {"name": names.ENV_VNPU_SPECS, "value": ""}


def device_indexes_env(count: int) -> dict[str, Any]:
    """CANN's indexes of all the container's vNPUs: it numbers them 0..count-1 in
    ascending id and reads ASCEND_RT_VISIBLE_DEVICES as such indexes, so a vNPU id
    there (as an image, an envFrom source or a launcher copying
    ASCEND_VISIBLE_DEVICES brings) names no device. Not a device grant: it only
    picks among the devices the container holds (docs/USAGE.md)."""
    return {"name": names.ENV_RT_VISIBLE_DEVICES, "value": names.device_indexes(count)}


def device_env(with_vnpus: bool, count: int | None = None) -> list[dict[str, Any]]:
    """The entries that make the container's device list the operator's alone:
    the Ascend runtime reads the container's final environment, where an explicit
    env entry beats the image's ENV and any envFrom key of the same name. With
    `count`, the pod's number of vNPUs (each container it gives vNPUs holds them
    all), also the indexes CANN knows them by."""
    visible = visible_devices_env() if with_vnpus else no_devices_env()
    env = [visible, runtime_options_env(), no_vnpu_specs_env()]
    if with_vnpus and count is not None:
        env.append(device_indexes_env(count))
    return env


def mutate_pod(
    pod: Mapping[str, Any], runtime_class_name: str = "", charge: Charge | None = None
) -> list[JsonPatchOp]:
    """Ops adding the scheduling gate, the finalizer and the env; [] for pods not
    asking for vNPUs. Raises AnnotationError for a malformed request and
    AdmissionError for a pod whose fields have the wrong shape.

    With `runtime_class_name`, a pod that names no RuntimeClass gets that one
    (the runtime that maps vNPUs into containers, Ascend Docker Runtime on
    Ascend hosts). A pod that names another keeps it: its owner chose a
    runtime, perhaps one that wraps Ascend's, and we cannot tell.

    With `charge`, one container requests it (vnpu.io/aicore, memory-mb,
    vnpus) and no other container requests any vnpu.io resource: quota counts
    exactly what the ledger books, whatever the user wrote."""
    if not requests_vnpus(pod):
        return []
    request = parse_request(pod)
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise AdmissionError(["pod has no metadata or no spec"])

    ops = _strip_visible_devices(metadata)
    ops += _label_managed(metadata)
    ops += _ensure_in_list(
        spec.get("schedulingGates"),
        ("spec", "schedulingGates"),
        {"name": names.SCHEDULING_GATE},
        lambda item: isinstance(item, dict) and item.get("name") == names.SCHEDULING_GATE,
    )
    ops += _ensure_in_list(
        metadata.get("finalizers"),
        ("metadata", "finalizers"),
        names.POD_FINALIZER,
        lambda item: item == names.POD_FINALIZER,
    )
    # Every container, not only those vnpu.io/containers names: a left-out one gets an
    # empty device list, or its image or envFrom could name any vNPU on the node.
    chosen = set(_selected(pod, request.containers))
    for ref in pod_containers(pod):
        container = spec[ref.field][ref.index]
        ops += _env_ops(ref, container.get("env"), device_env(ref in chosen, request.count))
    if charge is not None:
        ops += _charge_ops(pod, _charged(pod, request.containers), charge)
    if runtime_class_name and not spec.get("runtimeClassName"):
        ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": runtime_class_name})
    return ops


def _label_managed(metadata: dict[str, Any]) -> list[JsonPatchOp]:
    labels = metadata.get("labels")
    if not isinstance(labels, dict):
        return [{"op": "add", "path": "/metadata/labels", "value": {names.LABEL_MANAGED: "true"}}]
    if labels.get(names.LABEL_MANAGED) == "true":
        return []
    return [{"op": "add", "path": json_pointer("metadata", "labels", names.LABEL_MANAGED),
             "value": "true"}]  # fmt: skip


def _strip_visible_devices(metadata: dict[str, Any]) -> list[JsonPatchOp]:
    # Only the operator may say which devices a pod gets: a value the user set at
    # creation would reach the containers through the downward API.
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict) and names.ANN_VISIBLE_DEVICES in annotations:
        path = json_pointer("metadata", "annotations", names.ANN_VISIBLE_DEVICES)
        return [{"op": "remove", "path": path}]
    return []


def _ensure_in_list(
    current: object, path: tuple[str, ...], item: object, present: Callable[[object], bool]
) -> list[JsonPatchOp]:
    if current is None:
        return [{"op": "add", "path": json_pointer(*path), "value": [item]}]
    if not isinstance(current, list):
        raise AdmissionError([f"{'.'.join(path)} is not a list"])
    if any(present(existing) for existing in current):
        return []
    return [{"op": "add", "path": json_pointer(*path, "-"), "value": item}]


def _selected(pod: Mapping[str, Any], wanted: tuple[str, ...] | None) -> list[ContainerRef]:
    refs = pod_containers(pod)
    if wanted is None:
        return refs
    return [ref for ref in refs if ref.name in wanted]


def _charged(pod: Mapping[str, Any], wanted: tuple[str, ...] | None) -> ContainerRef | None:
    # A regular container: an init container's requests count only as the max
    # with the others, and a sidecar's the same as a regular one's.
    regular = [ref for ref in pod_containers(pod) if ref.field == "containers"]
    chosen = [ref for ref in regular if wanted is None or ref.name in wanted]
    return (chosen or regular)[0] if regular else None


def _charge_ops(
    pod: Mapping[str, Any], target: ContainerRef | None, charge: Charge
) -> list[JsonPatchOp]:
    if target is None:
        raise AdmissionError(["spec.containers: the pod has no container to charge its vNPUs to"])
    ops: list[JsonPatchOp] = []
    spec = pod["spec"]
    for ref in pod_containers(pod):
        container = spec[ref.field][ref.index]
        base = ("spec", ref.field, ref.index, "resources")
        resources = container.get("resources")
        if resources is not None and not isinstance(resources, dict):
            raise AdmissionError([f"spec.{ref.field}[{ref.index}].resources is not an object"])
        wanted = charge.resources() if ref == target else {}
        if resources is None:
            if wanted:
                value = {"limits": dict(wanted), "requests": dict(wanted)}
                ops.append({"op": "add", "path": json_pointer(*base), "value": value})
            continue
        for section in ("limits", "requests"):
            ops += _section_ops((*base, section), resources.get(section), wanted)
    return ops


def _section_ops(
    path: tuple[str | int, ...], current: object, wanted: dict[str, str]
) -> list[JsonPatchOp]:
    if current is None:
        return [{"op": "add", "path": json_pointer(*path), "value": dict(wanted)}] if wanted else []
    if not isinstance(current, dict):
        raise AdmissionError([f"{'.'.join(str(p) for p in path[1:])} is not an object"])
    ops: list[JsonPatchOp] = []
    for key in current:
        if key.startswith(names.RESOURCE_PREFIX) and key not in wanted:
            ops.append({"op": "remove", "path": json_pointer(*path, key)})
    for key, value in wanted.items():
        if key not in current:
            ops.append({"op": "add", "path": json_pointer(*path, key), "value": value})
        elif quantity_value(current[key]) != int(value):
            ops.append({"op": "replace", "path": json_pointer(*path, key), "value": value})
    return ops


def mutate_ephemeral(pod: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[JsonPatchOp]:
    """Ops giving each ephemeral container added by this pods/ephemeralcontainers
    update an empty device list (a debug container has no vNPU of its own); the ones
    `old` already has are immutable and were covered when added."""
    if not requests_vnpus(pod):
        return []
    spec = pod.get("spec")
    items = spec.get("ephemeralContainers") if isinstance(spec, dict) else None
    if not isinstance(items, list):
        return []
    old_spec = (old or {}).get("spec")
    old_items = old_spec.get("ephemeralContainers") if isinstance(old_spec, dict) else None
    known = {c.get("name") for c in old_items or [] if isinstance(c, dict)}
    ops: list[JsonPatchOp] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or item.get("name") in known:
            continue
        ref = ContainerRef("ephemeralContainers", index, str(item.get("name")))
        ops += _env_ops(ref, item.get("env"), device_env(False))
    return ops


def _env_ops(ref: ContainerRef, env: object, wanted: list[dict[str, Any]]) -> list[JsonPatchOp]:
    base = ("spec", ref.field, ref.index, "env")
    if env is None:
        return [{"op": "add", "path": json_pointer(*base), "value": wanted}]
    if not isinstance(env, list):
        raise AdmissionError([f"spec.{ref.field}[{ref.index}].env is not a list"])
    for entry in env:
        if (
            isinstance(entry, dict)
            and entry.get("name") == names.ENV_VNPU_SPECS
            and (entry.get("value") or entry.get("valueFrom"))
        ):
            # Refused, not emptied: whoever wrote it expects a vNPU the runtime makes,
            # which would be behind the ledger (the device policy says the same).
            raise AdmissionError([
                f"spec.{ref.field}[{ref.index}].env {names.ENV_VNPU_SPECS}: no pod may set "
                "it; it makes the Ascend runtime create a vNPU of its own, behind the "
                "vnpu-operator's ledger (ask for vNPUs with the vnpu.io/template annotation)"
            ])  # fmt: skip

    # The system owns these variables: a user-set value is replaced, and later
    # duplicates (the kubelet lets the last one win) are removed.
    positions = {
        w["name"]: [
            i for i, e in enumerate(env) if isinstance(e, dict) and e.get("name") == w["name"]
        ]
        for w in wanted
    }
    doomed = sorted((i for found in positions.values() for i in found[1:]), reverse=True)
    ops: list[JsonPatchOp] = [{"op": "remove", "path": json_pointer(*base, i)} for i in doomed]
    for entry in wanted:
        found = positions[entry["name"]]
        if not found:
            ops.append({"op": "add", "path": json_pointer(*base, "-"), "value": entry})
        elif _normalized(env[found[0]]) != _normalized(entry):
            # Removals above shift the first occurrence down by those before it.
            index = found[0] - sum(1 for i in doomed if i < found[0])
            ops.append({"op": "replace", "path": json_pointer(*base, index), "value": entry})
    return ops


def _normalized(entry: dict[str, Any]) -> dict[str, Any]:
    """An env entry as the API server stores it: empty fields dropped and the
    fieldRef apiVersion defaulted, so that stored and written forms compare equal."""
    out = {k: v for k, v in entry.items() if v not in (None, "", {})}
    value_from = out.get("valueFrom")
    if isinstance(value_from, dict) and isinstance(value_from.get("fieldRef"), dict):
        field_ref = {"apiVersion": "v1", **value_from["fieldRef"]}
        out["valueFrom"] = {**value_from, "fieldRef": field_ref}
    return out
