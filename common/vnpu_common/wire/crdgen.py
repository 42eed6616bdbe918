"""Generates the CRD YAML in `crds/` from the pydantic models.

Pydantic emits JSON Schema (with `$ref`s, `anyOf` for optionals, titles);
the API server wants a structural OpenAPI v3 schema (everything inlined,
a type on every node, no `$ref`). `structural()` converts one to the other.
Every property must carry a description (a field's `Field(description=...)`,
else its model's docstring), so that `kubectl explain` documents all of them:
generation fails naming each property that has none.

    python -m vnpu_common.wire.crdgen crds/ charts/vnpu-operator/files/crds/   # write
    python -m vnpu_common.wire.crdgen --check crds/   # fail on drift
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from vnpu_common.wire import names
from vnpu_common.wire.models import (
    VNPUAllocationSpec,
    VNPUAllocationStatus,
    VNPUNodeSpec,
    VNPUNodeStatus,
)

_DROP_KEYS = {"title", "default"}

# The fields every object has: the API server publishes its own documentation of them
# (whatever a CRD says), and refuses a root `metadata` that says anything but its type.
_SERVER_DESCRIBED = {"apiVersion", "kind", "metadata"}


class UndescribedPropertyError(ValueError):
    """A CRD property without a description: `kubectl explain` would show it bare."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        super().__init__(
            "CRD properties without a description (give each a Field(description=...) in "
            "vnpu_common/wire/models.py): " + ", ".join(paths)
        )


def undescribed(schema: dict[str, Any], path: str, *, root: bool = True) -> list[str]:
    """Paths (kubectl explain's spelling, `[]` for list items) of properties with no
    description, depth first."""
    missing: list[str] = []
    for name, sub in schema.get("properties", {}).items():
        where = f"{path}.{name}"
        if root and name in _SERVER_DESCRIBED:
            continue
        if not str(sub.get("description", "")).strip():
            missing.append(where)
        missing += undescribed(sub, where, root=False)
    if isinstance(schema.get("items"), dict):
        missing += undescribed(schema["items"], f"{path}[]", root=False)
    return missing


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a model, as CRDs require."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Any] = schema.pop("$defs", {})
    converted: dict[str, Any] = _convert(schema, defs)
    return converted


def _convert(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_convert(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        # Optional[X] is `anyOf: [X, null]`; we never send nulls (exclude_none),
        # so the field is simply not required.
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unions other than Optional cannot be made structural: {node}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _convert({**options[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
            continue
        out[key] = _convert(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _object_root(
    spec: dict[str, Any] | None, status: dict[str, Any], *, spec_required: bool = True
) -> dict[str, Any]:
    props: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }
    root: dict[str, Any] = {"type": "object", "properties": props}
    if spec is not None:
        props["spec"] = spec
        if spec_required:
            root["required"] = ["spec"]
    props["status"] = status
    return root


def _crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    short: str,
    scope: str,
    schema: dict[str, Any],
    columns: list[dict[str, Any]],
    description: str,
) -> dict[str, Any]:
    schema = {**schema, "description": description}
    missing = undescribed(schema, kind)
    if missing:
        raise UndescribedPropertyError(missing)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{names.GROUP}"},
        "spec": {
            "group": names.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": [short],
                "categories": [names.CATEGORY],
            },
            "scope": scope,
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _col(name: str, type_: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "jsonPath": path, **extra}


def allocation_crd() -> dict[str, Any]:
    return _crd(
        kind=names.ALLOCATION_KIND,
        plural=names.ALLOCATION_PLURAL,
        singular=names.ALLOCATION_SINGULAR,
        short=names.ALLOCATION_SHORT,
        scope="Namespaced",
        schema=_object_root(structural(VNPUAllocationSpec), structural(VNPUAllocationStatus)),
        description="Binds a pod to one vNPU (node, chip, template, id). "
        "The node agent creates the vNPU and destroys it when the object is deleted.",
        columns=[
            _col("Pod", "string", ".spec.podName"),
            _col("Node", "string", ".spec.nodeName"),
            _col("Chip", "integer", ".spec.chip"),
            _col("Template", "string", ".spec.template"),
            _col("VNPU", "integer", ".spec.vnpuId"),
            _col("Phase", "string", ".status.phase"),
            _col("Age", "date", ".metadata.creationTimestamp"),
            _col("Message", "string", ".status.message", priority=1),
            _col("Claim", "string", ".spec.claim.name", priority=1),
        ],
    )


def node_crd() -> dict[str, Any]:
    return _crd(
        kind=names.NODE_KIND,
        plural=names.NODE_PLURAL,
        singular=names.NODE_SINGULAR,
        short=names.NODE_SHORT,
        scope="Cluster",
        # The agent creates VNPUNodes without a spec: only admins write it.
        schema=_object_root(
            structural(VNPUNodeSpec), structural(VNPUNodeStatus), spec_required=False
        ),
        description="Inventory of one node's NPU chips as its agent sees them; "
        "written by the agent only when it changes.",
        columns=[
            _col("Chips", "integer", ".status.chipCount"),
            _col("VNPUs", "integer", ".status.vnpuCount"),
            _col("Free-AICore", "integer", ".status.freeAICore"),
            _col("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
            _col("Cordoned", "string", ".status.cordoned"),
            _col("Unhealthy", "string", ".status.unhealthy"),
            _col("Age", "date", ".metadata.creationTimestamp"),
            _col("Driver", "string", ".status.driver", priority=1),
            _col("DRA", "boolean", ".status.dra", priority=1),
        ],
    )


def render_all() -> dict[str, str]:
    """File name -> YAML text of every CRD."""
    header = "# Generated by `make crds` from vnpu_common/wire/models.py. Do not edit.\n"
    out = {}
    for crd in (allocation_crd(), node_crd()):
        text = yaml.safe_dump(crd, sort_keys=False, width=100)
        out[f"{crd['metadata']['name']}.yaml"] = header + text
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", type=Path, nargs="+", metavar="directory")
    parser.add_argument("--check", action="store_true", help="fail if the files differ")
    args = parser.parse_args(argv)
    try:
        rendered = render_all()
    except UndescribedPropertyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    drift = []
    for directory in args.directories:
        for name, text in rendered.items():
            path: Path = directory / name
            if args.check:
                if not path.exists() or path.read_text() != text:
                    drift.append(str(path))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"wrote {path}")
    if drift:
        print("CRDs drifted from the models; run `make crds`: " + ", ".join(drift), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
