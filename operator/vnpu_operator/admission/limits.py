"""One request on every cluster: a pod asking `resources.limits: {vnpu.io/<template>: N}`
(docs/USAGE.md, "One request").

Where some DRA node offers the template (and the release serves it as an
extended resource), the scheduler serves the request from the DRA pool by a
claim of its own (KEP-5004), and the webhook only keeps the pod off annotation
nodes. Elsewhere (Kubernetes before 1.36, DRA off, a template only annotation
nodes offer) the webhook turns it into the annotation path's request: the
vnpu.io/template, vnpu.io/count and vnpu.io/containers annotations, after which
the pod is mutated and charged like any annotated pod, the charge keeping
vnpu.io/<template> = N. Either way quota on requests.vnpu.io/<template> counts
the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from vnpu_common.wire import names
from vnpu_common.wire.patches import json_pointer
from vnpu_common.wire.quantity import quantity_value
from vnpu_operator.admission.offered import OfferedTemplates
from vnpu_operator.annotations import COUNT_MAX, pod_containers, quote, resource_names

JsonPatchOp = dict[str, Any]


class Path(Enum):
    """Which front-end serves a pod's vnpu.io/<template> request."""

    DRA = "dra"
    ANNOTATION = "annotation"


@dataclass(frozen=True)
class Routing:
    """What the release serves, as the operator's settings say.

    `extended_resources`: DRA nodes serve vnpu.io/<template> (the chart made a
    DeviceClass per template with that extendedResourceName).
    `dra_node_selector`: the labels of the DRA nodes on a cluster that has
    both kinds (the chart's agent.draNodeSelector); a pod sent to DRA gets them
    in its nodeSelector, as annotation nodes list vnpu.io/<template> in their
    capacity and the scheduler could otherwise put it there with no vNPU."""

    extended_resources: bool = False
    dra_node_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Asker:
    """A container asking for vNPUs by resource name."""

    field: str  # "containers" or "initContainers"
    index: int
    name: str
    # A restartable init container runs beside the containers (a sidecar).
    sidecar: bool
    counts: Mapping[str, int]


@dataclass(frozen=True)
class LimitsRequest:
    """The vnpu.io/<template> resources a pod names."""

    askers: tuple[Asker, ...]
    problems: tuple[str, ...] = ()

    @property
    def templates(self) -> list[str]:
        return sorted({t for a in self.askers for t in a.counts})

    def count(self, template: str) -> int:
        """The pod's effective number, as Kubernetes sums a pod's requests:
        the containers and sidecars add up, a plain init container runs alone."""
        running = sum(
            a.counts.get(template, 0) for a in self.askers if a.field == "containers" or a.sidecar
        )
        alone = max(
            (
                a.counts.get(template, 0)
                for a in self.askers
                if a.field == "initContainers" and not a.sidecar
            ),
            default=0,
        )
        return max(running, alone)


def limits_request(pod: Mapping[str, Any]) -> LimitsRequest | None:
    """The request, or None when no container names a vnpu.io/<template> resource."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    askers: list[Asker] = []
    problems: list[str] = []
    for ref in pod_containers(pod):
        container = spec[ref.field][ref.index]
        counts = _counts(container, ref.field, ref.index, problems)
        if counts:
            askers.append(
                Asker(
                    ref.field,
                    ref.index,
                    ref.name,
                    sidecar=container.get("restartPolicy") == "Always",
                    counts=counts,
                )
            )
    if not askers and not problems:
        return None
    return LimitsRequest(tuple(askers), tuple(problems))


def _counts(
    container: Mapping[str, Any], list_field: str, index: int, problems: list[str]
) -> dict[str, int]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    where = f"spec.{list_field}[{index}] ({container.get('name')})"
    out: dict[str, int] = {}
    # Limits are what an extended resource is asked by (requests must equal them, and
    # default to them); requests alone the API server refuses, but say it here first.
    limits = _mapping(resources.get("limits"))
    requests = _mapping(resources.get("requests"))
    for key in sorted(set(limits) | set(requests)):
        template = names.template_of_resource(str(key))
        if template is None:
            continue
        raw = limits.get(key, requests.get(key))
        value = quantity_value(raw)
        if value is None or value < 0 or (isinstance(raw, str) and not raw.isdigit()):
            problems.append(f"{where}: {key} {quote(raw)} is not a whole number of vNPUs (e.g. 1)")
            continue
        if key in requests and key in limits and quantity_value(requests[key]) != value:
            problems.append(f"{where}: {key} must be the same in requests and limits")
            continue
        if value > 0:
            out[template] = value
    return out


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def route(
    request: LimitsRequest,
    offered: OfferedTemplates,
    routing: Routing,
    *,
    chip_model: bool = False,
) -> Path:
    """DRA when the release serves templates as extended resources and a DRA
    node offers every template the pod names; the annotation path otherwise,
    and always for a pod naming vnpu.io/chip-model (a template's class on DRA
    nodes spans every model offering it). DRA first: where a cluster has both,
    the nodes that serve claims are the ones being moved to (docs/DECISIONS.md,
    "One request on every cluster")."""
    if chip_model:
        return Path.ANNOTATION
    if routing.extended_resources and all(offered.on_dra(t) for t in request.templates):
        return Path.DRA
    return Path.ANNOTATION


def annotation_problems(request: LimitsRequest) -> list[str]:
    """What the annotation path cannot serve of a request it was sent."""
    problems = list(request.problems)
    templates = request.templates
    if len(templates) > 1:
        problems.append(
            f"resources {', '.join(names.template_resource(t) for t in templates)}: a pod on "
            "annotation nodes gets vNPUs of one template (several need DRA nodes, Kubernetes "
            "1.36 or later); ask for one template, or split the pod"
        )
    elif templates and request.count(templates[0]) > COUNT_MAX:
        template = templates[0]
        problems.append(
            f"resources {names.template_resource(template)}: {request.count(template)} vNPUs; "
            f"a pod on annotation nodes gets at most {COUNT_MAX}"
        )
    return problems


def as_annotations(request: LimitsRequest) -> dict[str, str]:
    """The annotation path's request for a LimitsRequest of one template."""
    template = request.templates[0]
    out = {names.ANN_TEMPLATE: template, names.ANN_COUNT: str(request.count(template))}
    out[names.ANN_CONTAINERS] = ",".join(dict.fromkeys(a.name for a in request.askers))
    return out


def annotate(pod: Mapping[str, Any], request: LimitsRequest) -> tuple[dict[str, Any], JsonPatchOp]:
    """The pod with the annotation path's request added, and the op that adds it."""
    wanted = as_annotations(request)
    metadata = dict(pod.get("metadata") or {})
    current = metadata.get("annotations")
    if isinstance(current, Mapping):
        op: JsonPatchOp = {
            "op": "add",
            "path": json_pointer("metadata", "annotations"),
            "value": {**current, **wanted},
        }
    else:
        op = {"op": "add", "path": json_pointer("metadata", "annotations"), "value": wanted}
    metadata["annotations"] = op["value"]
    return {**pod, "metadata": metadata}, op


def dra_problems(pod: Mapping[str, Any], request: LimitsRequest) -> list[str]:
    """What a pod sent to DRA may not carry: the annotation path's charges
    (vnpu.io/vnpus and the like), which no node of DRA serves and which would
    count in quota what the pod does not get."""
    problems = list(request.problems)
    spec = _mapping(pod.get("spec"))
    for ref in pod_containers(pod):
        resources = spec[ref.field][ref.index].get("resources")
        charged = sorted(k for k in resource_names(resources) if k in names.EXTENDED_RESOURCES)
        if charged:
            problems.append(
                f"spec.{ref.field}[{ref.index}] ({ref.name}): resources "
                f"{', '.join(charged)} are the vnpu-operator's charges; ask for vNPUs with "
                f"{names.RESOURCE_PREFIX}<template> alone"
            )
    return problems


def steer_ops(
    pod: Mapping[str, Any], selector: Mapping[str, str]
) -> tuple[list[JsonPatchOp], list[str]]:
    """Ops adding the DRA nodes' labels to the pod's nodeSelector (ANDed with
    any affinity the pod has), and the problems of a pod whose nodeSelector
    asks otherwise."""
    if not selector:
        return [], []
    spec = _mapping(pod.get("spec"))
    current = spec.get("nodeSelector")
    if current is not None and not isinstance(current, Mapping):
        return [], ["spec.nodeSelector is not an object"]
    current = current or {}
    clashes = [k for k, v in selector.items() if k in current and current[k] != v]
    if clashes:
        return [], [
            f"spec.nodeSelector {', '.join(f'{k}={current[k]}' for k in sorted(clashes))}: the "
            f"DRA nodes that serve {names.RESOURCE_PREFIX}<template> are "
            f"{', '.join(f'{k}={v}' for k, v in sorted(selector.items()))}"
        ]
    missing = {k: v for k, v in selector.items() if k not in current}
    if not missing:
        return [], []
    if "nodeSelector" not in spec:
        return [{"op": "add", "path": "/spec/nodeSelector", "value": dict(missing)}], []
    return [
        {"op": "add", "path": json_pointer("spec", "nodeSelector", k), "value": v}
        for k, v in sorted(missing.items())
    ], []
