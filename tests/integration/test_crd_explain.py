"""`kubectl explain` documents every field of our CRDs, as a real API server publishes them
(the session plane installs crds/ as generated from the models)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from localplane import LocalPlane
from vnpu_common.wire import crdgen, names

pytestmark = pytest.mark.plane


def _fields(node: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(kubectl explain path, description) of every property below `node`."""
    out: list[tuple[str, str]] = []
    for name, sub in node.get("properties", {}).items():
        if name in ("apiVersion", "kind", "metadata") and "." not in path:
            out.append((f"{path}.{name}", ""))  # the API server's own text
            continue
        out.append((f"{path}.{name}", sub["description"]))
        out += _fields(sub, f"{path}.{name}")
    if "items" in node:
        out += _fields(node["items"], path)  # kubectl explain has no [] for list items
    return out


def _words(text: str) -> str:
    return " ".join(text.split())


def test_kubectl_explain_shows_every_fields_description(plane: LocalPlane) -> None:
    checked = 0
    for text in crdgen.render_all().values():
        crd = yaml.safe_load(text)
        plural = crd["spec"]["names"]["plural"]
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        fields = [(plural, schema["description"]), *_fields(schema, plural)]
        for path, description in fields:
            out = plane.kubectl("explain", f"--api-version={names.API_VERSION}", path).stdout
            shown = _words(out.partition("DESCRIPTION:")[2]).partition(" FIELDS:")[0]
            assert shown, f"kubectl explain {path} shows no description:\n{out}"
            assert _words(description) in shown, f"kubectl explain {path}:\n{out}"
            checked += 1
    assert checked >= 55
