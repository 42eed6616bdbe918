"""A Kubernetes object as the API server sends it: parsed JSON, plain dicts
and lists, never the client's model classes (kube/rawcall.py says why). One alias
for the operator, the agent and the shared code; no imports beyond typing, so
the pure rules may use it too."""

from __future__ import annotations

from typing import Any

Raw = dict[str, Any]
