"""The one pod patch that starts a pod on its vNPUs: pin it to the chosen
node, publish the device ids, remove our scheduling gate.

While a pod is gated, Kubernetes (1.30+) only lets its scheduling directives
narrow: set required node affinity where there is none, or add match
expressions to each existing required term, or add to nodeSelector. Pinning
therefore:
- with no required node affinity: sets one term matching `metadata.name`
  (exact, whatever the node's labels);
- with existing terms: adds a `kubernetes.io/hostname In [<label value>]`
  expression to every term, keeping what the pod asked for (a term the node
  does not satisfy stays unsatisfiable, as the user wrote it).
The patch is a JSON patch guarded by `test` ops on the gates and affinity it
read, so a concurrent change to the pod fails it instead of being lost.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from vnpu_common.wire import names
from vnpu_common.wire.patches import json_pointer

HOSTNAME_LABEL = "kubernetes.io/hostname"


class PinningError(ValueError):
    """The pod cannot be pinned as it is (e.g. the node has no hostname label)."""


# The pin, as pin_patch writes it and unpinned recognises it: one term for
# the exact node when the pod had no required node affinity, else a hostname
# expression appended to each of its terms.
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _exact_node_term(node: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}


def _hostname_expression(hostname: str) -> dict[str, Any]:
    return {"key": HOSTNAME_LABEL, "operator": "In", "values": [hostname]}


def pin_patch(
    pod: Mapping[str, Any],
    node: str,
    node_labels: Mapping[str, str],
    visible_devices: Sequence[int],
) -> list[dict[str, Any]]:
    """JSON patch ops (RFC 6902) that pin, annotate and ungate `pod`."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    ops: list[dict[str, Any]] = []

    gates = list(spec.get("schedulingGates") or [])
    remaining = [g for g in gates if g.get("name") != names.SCHEDULING_GATE]
    ops.append({"op": "test", "path": "/spec/schedulingGates", "value": gates})
    if remaining:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": remaining})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})

    devices = ",".join(str(i) for i in visible_devices)
    ann_path = json_pointer("metadata", "annotations", names.ANN_VISIBLE_DEVICES)
    if meta.get("annotations"):
        ops.append({"op": "add", "path": ann_path, "value": devices})
    else:
        ops.append(
            {"op": "add", "path": "/metadata/annotations",
             "value": {names.ANN_VISIBLE_DEVICES: devices}}
        )  # fmt: skip

    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get(_REQUIRED) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        pinned: dict[str, Any] = {"nodeSelectorTerms": [_exact_node_term(node)]}
        value: dict[str, Any]
        if not affinity:
            path, value = "/spec/affinity", {"nodeAffinity": {_REQUIRED: pinned}}
        elif not node_affinity:
            path, value = "/spec/affinity/nodeAffinity", {_REQUIRED: pinned}
        else:
            path, value = f"/spec/affinity/nodeAffinity/{_REQUIRED}", pinned
        ops.append({"op": "add", "path": path, "value": value})
        return ops

    hostname = node_labels.get(HOSTNAME_LABEL)
    if not hostname:
        raise PinningError(
            f"node {node} has no {HOSTNAME_LABEL} label; cannot narrow the pod's existing "
            "required node affinity to it"
        )
    path = f"/spec/affinity/nodeAffinity/{_REQUIRED}"
    ops.append({"op": "test", "path": f"{path}/nodeSelectorTerms", "value": terms})
    narrowed = []
    for term in terms:
        term = copy.deepcopy(term)
        exprs = list(term.get("matchExpressions") or [])
        exprs.append(_hostname_expression(hostname))
        term["matchExpressions"] = exprs
        narrowed.append(term)
    ops.append({"op": "replace", "path": f"{path}/nodeSelectorTerms", "value": narrowed})
    return ops


def unpinned(pod: Mapping[str, Any], node: str, node_labels: Mapping[str, str]) -> dict[str, Any]:
    """The pod as it asked to be scheduled, without the pin to `node` that
    `pin_patch` added (its exact-node term, or the hostname expression
    appended to each of its terms): where else it could run if created
    again. A pod still gated was never pinned; a pod pinned otherwise is
    returned as it is, which keeps it on its node."""
    out = copy.deepcopy(dict(pod))
    spec = out.get("spec") or {}
    gates = spec.get("schedulingGates") or []
    if any(g.get("name") == names.SCHEDULING_GATE for g in gates):
        return out
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = (node_affinity.get(_REQUIRED) or {}).get("nodeSelectorTerms") or []
    if terms == [_exact_node_term(node)]:
        del node_affinity[_REQUIRED]
        if not node_affinity:
            del spec["affinity"]["nodeAffinity"]
        if not spec["affinity"]:
            del spec["affinity"]
        return out
    hostname = node_labels.get(HOSTNAME_LABEL)
    pin = _hostname_expression(hostname) if hostname else None
    if terms and pin and all((t.get("matchExpressions") or [])[-1:] == [pin] for t in terms):
        for term in terms:
            term["matchExpressions"].pop()
            if not term["matchExpressions"]:
                del term["matchExpressions"]
    return out
