"""How both components write patches: content types, JSON pointers, and the
guarded finalizer removal.

The Kubernetes client would pick a JSON patch for a dict body on custom
objects and a strategic merge for core kinds, so every patch names its
content type explicitly with one of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

MERGE: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC: Final = "application/strategic-merge-patch+json"

JsonPatch = list[dict[str, Any]]


def json_pointer(*tokens: str | int) -> str:
    """RFC 6901: "~" and "/" inside a token are escaped, "~" first (an
    annotation key such as vnpu.io/visible-devices is one token)."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


def uid_guard(meta: Mapping[str, Any]) -> JsonPatch:
    """A `test` of the object's uid: a cached copy may be stale and an object
    of the same name may have replaced it (a pod created again under its
    name), which must never receive a write meant for the old one."""
    if not meta.get("uid"):
        return []
    return [{"op": "test", "path": "/metadata/uid", "value": meta["uid"]}]


def finalizer_removal(meta: Mapping[str, Any], finalizer: str) -> JsonPatch | None:
    """Removes `finalizer` by index, guarded by `test`s of the uid and of the
    entry, so a replaced object or a concurrently changed list fails the
    request (422) instead of losing someone else's finalizer. None when the
    finalizer is not there."""
    finalizers = list(meta.get("finalizers") or [])
    if finalizer not in finalizers:
        return None
    path = json_pointer("metadata", "finalizers", finalizers.index(finalizer))
    return [
        *uid_guard(meta),
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]
