"""The copies of API objects the operator keeps: only what it reads.

Every cache entry is made here, so what the operator reads of an object and
what it keeps cannot drift apart. Containers, statuses and managedFields
are most of a pod object; at 2000 pods they were most of the operator's
memory. A Node's status churns with heartbeats and is never read.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import orjson

from vnpu_common.wire import names
from vnpu_common.wire.quantity import quantity_value
from vnpu_common.wire.types import Raw

# What the operator reads of a pod's spec: placement (selector, affinity,
# tolerations), pinning (gates, affinity), the lifecycle (gates) and
# preemption (priority, preemptionPolicy).
POD_SPEC_READ = (
    "schedulingGates",
    "nodeSelector",
    "affinity",
    "tolerations",
    "nodeName",
    "priority",
    "preemptionPolicy",
)
# What it reads of a pod's status: the phase, and the node a preempting pod
# waits on (vnpu_operator.steps.preempt), which survives an operator restart there.
POD_STATUS_READ = ("phase", "nominatedNodeName")


# The slim copy's key for the pod's vnpu.io/* container requests, summed (the
# charge the webhook wrote): the containers themselves are not kept.
POD_CHARGED = "charged"


def charged_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Resource -> amount of every vnpu.io/* request of the pod's containers
    and init containers, summed: what the webhook charged it ({} for a pod
    charged nothing). The slim copy keeps the sum."""
    if POD_CHARGED in pod:
        kept = pod[POD_CHARGED]
        return dict(kept) if isinstance(kept, Mapping) else {}
    spec = pod.get("spec") or {}
    out: dict[str, int] = {}
    for field in ("containers", "initContainers"):
        containers = spec.get(field) if isinstance(spec, Mapping) else None
        for container in containers if isinstance(containers, list) else []:
            resources = container.get("resources") if isinstance(container, Mapping) else None
            requests = resources.get("requests") if isinstance(resources, Mapping) else None
            for key, value in requests.items() if isinstance(requests, Mapping) else ():
                amount = quantity_value(value)
                if (
                    isinstance(key, str)
                    and key.startswith(names.RESOURCE_PREFIX)
                    and amount is not None
                ):
                    out[key] = out.get(key, 0) + amount
    return out


# What the operator reads of a pod's or an allocation's metadata: the name
# and uid it writes and reports by (Events carry the resourceVersion), the
# labels, annotations and finalizers it decides on, and whether and how it
# is being deleted. ownerReferences, timestamps and generation were a fifth
# of a cached allocation and are never read.
METADATA_READ = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "annotations",
    "finalizers",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def _metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {k: v for k, v in meta.items() if k != "managedFields"}


def _read_metadata(
    obj: Mapping[str, Any], shared: tuple[str, ...] = ("finalizers",)
) -> dict[str, Any]:
    """The metadata the operator reads, the parts named in `shared` kept
    once for all equal ones (an allocation's labels name its pod: never
    alike)."""
    meta = obj.get("metadata") or {}
    out = {k: meta[k] for k in METADATA_READ if k in meta}
    for key in shared:
        if key in out:
            out[key] = ALIKE.share(out[key])
    return out


class Alike:
    """One object for every equal part of the cached copies.

    Most pods carry the same tolerations (the two the API server adds to
    every pod), the same finalizers and labels, and pods on one node the
    same pin: each pod parsed its own copy, a third of a cached pod (10000
    live pods on 1000 nodes: 950 B of tolerations and 1290 B of affinity
    per pod). Equal parts are kept once, as a JSON value with sorted keys
    names them.

    The shared parts are read only, as every cached copy already is: the
    code that derives a change from one (pinning, unpinned) copies first.

    A part no cached copy holds any more is forgotten when the table has
    doubled since the last sweep, so the table lives as long as the parts
    it shares (amortized: each entry is looked at once per doubling)."""

    def __init__(self, first_sweep: int = 1024) -> None:
        self._parts: dict[bytes, Any] = {}
        self._first_sweep = first_sweep
        self._sweep_at = first_sweep

    def __len__(self) -> int:
        return len(self._parts)

    def share(self, value: Any) -> Any:
        """The kept object equal to `value`, else `value`, kept from now."""
        if not isinstance(value, dict | list) or not value:
            return value
        try:
            key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a value JSON cannot name: kept as it is
            return value
        kept = self._parts.get(key)
        if kept is not None:
            return kept
        if len(self._parts) >= self._sweep_at:
            self.sweep()
        self._parts[key] = value
        return value

    def sweep(self) -> None:
        """Forgets the parts only this table holds."""
        parts = self._parts
        for key in list(parts):
            # The table's reference and getrefcount's own argument: 2 for a
            # part no cached copy holds.
            if sys.getrefcount(parts[key]) <= 2:
                del parts[key]
        self._sweep_at = max(self._first_sweep, 2 * len(self._parts))


# One table for the process: equal parts are equal wherever they are cached.
ALIKE = Alike()


def slim_pod(pod: Mapping[str, Any]) -> Raw:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": _read_metadata(pod, ("labels", "finalizers")),
        "spec": {k: ALIKE.share(spec[k]) for k in POD_SPEC_READ if k in spec},
        "status": ALIKE.share({k: status[k] for k in POD_STATUS_READ if k in status}),
        POD_CHARGED: ALIKE.share(charged_requests(pod)),
    }


def slim_node(node: Mapping[str, Any]) -> Raw:
    """Labels and taints, what placement and pinning read of a Node, and our
    extended resources in its status, which the operator advertises."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return {
        "metadata": {"name": str(meta.get("name", "")), "labels": dict(meta.get("labels") or {})},
        "spec": {"taints": list(spec.get("taints") or [])},
        "status": extended_resources(node.get("status") or {}),
    }


def extended_resources(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Our resources (vnpu.io/...) in a Node's status, per section."""
    return {
        section: {
            k: v
            for k, v in (status.get(section) or {}).items()
            if k.startswith(names.RESOURCE_PREFIX)
        }
        for section in ("capacity", "allocatable")
    }


# What it reads of an allocation's status (lifecycle.AllocView): the agent's
# conditions repeat the phase in words, a third of a cached allocation.
ALLOCATION_STATUS_READ = ("phase", "message")


def slim_allocation(obj: Mapping[str, Any]) -> Raw:
    """An allocation as the controller keeps it: the metadata it reads, the
    spec, and the status but for its conditions."""
    status = obj.get("status") or {}
    return {
        "apiVersion": obj.get("apiVersion", names.API_VERSION),
        "kind": obj.get("kind", names.ALLOCATION_KIND),
        "metadata": _read_metadata(obj),
        "spec": obj.get("spec") or {},
        "status": ALIKE.share({k: status[k] for k in ALLOCATION_STATUS_READ if k in status}),
    }


def identity(obj: Mapping[str, Any]) -> Raw:
    """What an informer keeps of an object whose slim copy the controller
    holds: enough to report it gone."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("uid", "name", "namespace")}}


def slim_object(body: Mapping[str, Any]) -> Raw:
    """One of our kinds (a VNPUNode) whole but for managedFields, which the
    metadata the inventories keep would otherwise carry. A shallow copy: the
    watch's object is not changed."""
    raw = {k: body[k] for k in body}
    if "managedFields" in (raw.get("metadata") or {}):
        raw["metadata"] = _metadata(raw)
    return raw


def uid_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def phase_of(obj: Mapping[str, Any] | None) -> Any:
    return ((obj or {}).get("status") or {}).get("phase")


def allocation_pod_uid(obj: Mapping[str, Any]) -> str:
    """The UID of the pod an allocation is for (its spec, else its label);
    "" for one that serves a ResourceClaim: the claim controller
    (vnpu_operator.dra) owns those, and the pod controller must not release
    them when their pod goes."""
    if (obj.get("spec") or {}).get("claim"):
        return ""
    spec_uid = (obj.get("spec") or {}).get("podUID")
    label_uid = ((obj.get("metadata") or {}).get("labels") or {}).get(names.LABEL_POD_UID)
    return str(spec_uid or label_uid or "")


def resource_version(obj: Mapping[str, Any]) -> int | None:
    """As a number: etcd's revision. The API calls resourceVersions opaque,
    but every server in use numbers them so; if one ever does not, nothing
    is forgotten (None never compares)."""
    value = (obj.get("metadata") or {}).get("resourceVersion")
    if not isinstance(value, str | int):
        return None
    try:
        return int(value)
    except ValueError:
        return None
