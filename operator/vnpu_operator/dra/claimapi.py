"""The operator's reads and writes of ResourceClaims (resource.k8s.io/v1).

Only the claim's `status.devices` entries of our driver are written, by
server-side apply under a field manager of their own: the scheduler owns the
allocation and reservedFor in the same status, and apply leaves what another
manager set alone (and removes an entry of ours that the plan drops).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from vnpu_common.kube.apiwrites import Writes
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names
from vnpu_common.wire.events import now_rfc3339
from vnpu_common.wire.types import Raw

FIELD_MANAGER = "vnpu-operator-dra"
APPLY = "application/apply-patch+yaml"


def status_body(namespace: str, name: str, devices: Sequence[Mapping[str, Any]]) -> Raw:
    """The apply configuration of our status.devices entries; every condition
    gets lastTransitionTime now (the entries are written only when a
    condition changes)."""
    stamp = now_rfc3339()
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "devices": [
                {
                    **entry,
                    "conditions": [
                        {**c, "lastTransitionTime": stamp} for c in entry.get("conditions") or []
                    ],
                }
                for entry in devices
            ]
        },
    }


class ClaimApi:
    def __init__(
        self,
        api_client: client.ApiClient,
        errors: Counter,
        fence: Callable[[str], None] | None = None,
    ) -> None:
        """`fence`: as OperatorApi's (only the leader writes)."""
        self.resource = client.ResourceV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self._writes = Writes(errors, fence)

    async def get(self, namespace: str, name: str) -> Raw | None:
        """The claim, or None if there is none of that name."""
        try:
            claim: Raw = await call_json(
                self.resource.read_namespaced_resource_claim, name, namespace
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return claim

    async def get_allocation(self, key: str) -> Raw | None:
        """A read, not a write: the VNPUAllocation `namespace/name`, or None if
        there is none (to settle a create whose outcome was unknown)."""
        namespace, _, name = key.partition("/")
        try:
            obj: Raw = await call_json(
                self.custom.get_namespaced_custom_object,
                names.GROUP,
                names.VERSION,
                namespace,
                names.ALLOCATION_PLURAL,
                name,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def set_device_statuses(
        self, namespace: str, name: str, devices: Sequence[Mapping[str, Any]]
    ) -> None:
        """Our entries of the claim's status.devices become `devices`; a claim
        that is gone needs none."""
        try:
            await self._writes.call(
                "apply_claim_status",
                self.resource.patch_namespaced_resource_claim_status,
                name,
                namespace,
                status_body(namespace, name, devices),
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY,
                expected=(404,),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
