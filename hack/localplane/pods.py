"""Pod manifests that ask for vNPUs, for the tests, the benchmark and the demo."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vnpu_common.wire import names

DEFAULT_TEMPLATE = "vir05_1c_16g"


def vnpu_pod(
    name: str,
    namespace: str,
    *,
    template: str | None = DEFAULT_TEMPLATE,
    count: int | str | None = None,
    chip_model: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    containers: Sequence[str] = ("main",),
    init_containers: Sequence[str] = (),
    node_selector: Mapping[str, str] | None = None,
    scheduling_gates: Sequence[str] = (),
    finalizers: Sequence[str] | None = None,
    uid: str | None = None,
    phase: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod asking for vNPUs through the annotations `template`, `count`
    and `chip_model`; `annotations` come after them, so a test can write a
    malformed value of its own. `template=None` gives a pod that does not ask.

    Containers and init containers are busybox, named as given. `uid`,
    `phase`, `finalizers` and `scheduling_gates` shape a pod as the API
    serves it (the webhook's gate and finalizer included); `metadata` and
    `spec` add any other field (tolerations, affinity, deletionTimestamp).
    """
    ann: dict[str, str] = {}
    if template is not None:
        ann[names.ANN_TEMPLATE] = template
    if count is not None:
        ann[names.ANN_COUNT] = str(count)
    if chip_model is not None:
        ann[names.ANN_CHIP_MODEL] = chip_model
    ann.update(annotations or {})
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid is not None:
        meta["uid"] = uid
    if labels:
        meta["labels"] = dict(labels)
    if ann:
        meta["annotations"] = ann
    if finalizers is not None:
        meta["finalizers"] = list(finalizers)
    meta.update(metadata or {})
    body: dict[str, Any] = {"containers": [{"name": c, "image": "busybox"} for c in containers]}
    if init_containers:
        body["initContainers"] = [{"name": c, "image": "busybox"} for c in init_containers]
    if node_selector is not None:
        body["nodeSelector"] = dict(node_selector)
    if scheduling_gates:
        body["schedulingGates"] = [{"name": g} for g in scheduling_gates]
    body.update(spec or {})
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}
    if phase is not None:
        pod["status"] = {"phase": phase}
    return pod
