"""The namespaces' vNPU quotas as the webhook reads them, to refuse a pod in our words.

The API server's ResourceQuota admission is what enforces quota; it runs after
the webhooks and says "exceeded quota: NAME, requested: ..., used: ...,
limited: ...", without the namespace. The webhook refuses first, when the
quota's status already shows the pod cannot fit, naming the namespace, the
resource, used and hard. In a burst the status lags the API server's own
count, and the API server's message answers instead: either way the pod is
refused, and never charged twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vnpu_common.wire import names
from vnpu_common.wire.quantity import quantity_value
from vnpu_operator.admission.charges import Charge


@dataclass(frozen=True)
class VNPUQuota:
    """One ResourceQuota's vNPU part: resource -> hard and used."""

    namespace: str
    name: str
    hard: Mapping[str, int] = field(default_factory=dict)
    used: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> VNPUQuota | None:
        """None for a quota that sets no vNPU resource, or applies to some
        pods only (scopes): the API server judges those alone."""
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            return None
        status = obj.get("status") or {}
        hard = _ours(spec.get("hard"))
        if not hard:
            return None
        return cls(str(meta.get("namespace", "")), str(meta.get("name", "")), hard,
                   _ours(status.get("used")))  # fmt: skip


def _ours(resources: object) -> dict[str, int]:
    if not isinstance(resources, Mapping):
        return {}
    out: dict[str, int] = {}
    for key, value in resources.items():
        resource, number = key.removeprefix(names.QUOTA_PREFIX), quantity_value(value)
        ours = key.startswith(names.QUOTA_PREFIX) and (
            resource in names.EXTENDED_RESOURCES or names.template_of_resource(resource) is not None
        )
        if ours and number is not None:
            out[resource] = number
    return out


class QuotaBook:
    """Namespace -> its vNPU quotas, fed by the ResourceQuota watch."""

    def __init__(self) -> None:
        self._by_namespace: dict[str, dict[str, VNPUQuota]] = {}

    def seen(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        quota = None if deleted else VNPUQuota.from_api(obj)
        quotas = self._by_namespace.setdefault(namespace, {})
        if quota is None:
            quotas.pop(name, None)
        else:
            quotas[name] = quota
        if not quotas:
            del self._by_namespace[namespace]

    def quotas(self, namespace: str) -> list[VNPUQuota]:
        return [q for _, q in sorted(self._by_namespace.get(namespace, {}).items())]

    def exceeded(self, namespace: str, charge: Charge) -> str | None:
        """Why `charge` does not fit the namespace's quotas, or None."""
        wanted = charge.amounts()
        for quota in self.quotas(namespace):
            for resource, hard in sorted(quota.hard.items()):
                used = quota.used.get(resource, 0)
                asked = wanted.get(resource, 0)  # another template's quota: none
                if asked and used + asked > hard:
                    return (
                        f"namespace {namespace} is over its vNPU quota: "
                        f"{names.QUOTA_PREFIX}{resource} requested {asked}, "
                        f"used {used}, hard {hard} (ResourceQuota {namespace}/{quota.name}); "
                        "the pod may be created once vNPU pods of the namespace end, "
                        "or an admin raises the quota"
                    )
        return None
