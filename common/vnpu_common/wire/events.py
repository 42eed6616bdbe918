"""The core/v1 Event both components write about the objects they manage."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

# The API server refuses longer messages; ours stay well below.
MESSAGE_MAX = 1024


def now_rfc3339() -> str:
    """A Kubernetes `Time` value (second precision)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    involved: Mapping[str, Any],
    *,
    reason: str,
    message: str,
    warning: bool,
    component: str,
    host: str = "",
    reporting_component: str | None = None,
) -> dict[str, Any]:
    """An Event about `involved` (an object as the API returns it), posted
    in its namespace; `host` is the node or pod that reports it."""
    meta = involved.get("metadata") or {}
    now = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "generateName": f"{meta.get('name') or 'vnpu'}.",
            "namespace": meta.get("namespace") or "default",
        },
        "involvedObject": {
            "apiVersion": involved.get("apiVersion", "v1"),
            "kind": involved.get("kind", "Pod"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component, "host": host},
        "reportingComponent": reporting_component or component,
        "reportingInstance": host or component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
