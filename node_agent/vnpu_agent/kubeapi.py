"""The agent's writes to the API server, each one request.

Kept in one place so that the API economy (writes per pod lifecycle) is easy
to audit: a status patch, a finalizer removal, the VNPUNode status (and its
restoration when someone else removed or changed it), the Lease, and Events
for what a user must see. Every write that fails is counted, by operation and
HTTP status, in `vnpu_agent_api_errors_total` (through `vnpu_common.kube.apiwrites`,
as the operator's are); an answer the agent acts on (NotFound: create the
object; AlreadyExists: label it; the allocation gone or replaced) is not a
failure.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from vnpu_common.kube.apiwrites import Expected, Writes, remove_allocation_finalizer
from vnpu_common.wire import names
from vnpu_common.wire.events import event_body
from vnpu_common.wire.patches import JSON_PATCH, MERGE, uid_guard
from vnpu_common.wire.types import Raw

log = logging.getLogger(__name__)


class AgentApi:
    def __init__(self, api_client: client.ApiClient, namespace: str, errors: Counter) -> None:
        """`errors`: the counter of failed writes, labelled (operation, status)."""
        self._writes = Writes(errors)
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.namespace = namespace

    async def patch_allocation_status(self, obj: Raw, status: dict[str, Any]) -> str | None:
        """Sets the given status fields of the allocation `obj` describes,
        guarded by its uid. Returns the resourceVersion the write made, or
        None when the object is gone or was replaced."""
        meta = obj["metadata"]
        ops = uid_guard(meta)
        if obj.get("status"):
            ops += [{"op": "add", "path": f"/status/{k}", "value": v} for k, v in status.items()]
        else:
            ops.append({"op": "add", "path": "/status", "value": status})
        try:
            written = await self._writes.call_json(
                "patch_allocation_status",
                self.custom.patch_namespaced_custom_object_status,
                names.GROUP,
                names.VERSION,
                meta["namespace"],
                names.ALLOCATION_PLURAL,
                meta["name"],
                ops,
                _content_type=JSON_PATCH,
                expected=(404, 422),
            )
        except ApiException as exc:
            if exc.status in (404, 422):
                log.info("allocation %s/%s gone or replaced; status not written",
                         meta["namespace"], meta["name"])  # fmt: skip
                return None
            raise
        return str((written.get("metadata") or {}).get("resourceVersion", ""))

    async def remove_finalizer(self, obj: Raw) -> None:
        """Once the vNPU is destroyed (`remove_allocation_finalizer`)."""
        meta = obj["metadata"]
        refused = await remove_allocation_finalizer(self._writes, self.custom, meta)
        if refused is not None and refused.status == 422:
            # A test failed: replaced object, or a changed list the next
            # event brings (and the release runs again on it).
            log.info("finalizer of %s/%s not removed: %s", meta["namespace"], meta["name"],
                     refused.reason)  # fmt: skip

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> Raw:
        """Patches the status; creates the VNPUNode first if it is missing.
        Returns the object the server then holds."""
        try:
            return await self._patch_node_status(node, status, expected=(404,))
        except ApiException as exc:
            if exc.status != 404:
                raise
            await self._create_node(node)
            return await self._patch_node_status(node, status)

    async def restore_node(self, node: str, status: dict[str, Any], *, exists: bool) -> Raw:
        """Puts back a VNPUNode someone else deleted or unlabelled (`exists`:
        whether the object is believed to be there, without its label):
        the object with its `vnpu.io/node` label, then the status. Returns
        the object the server then holds."""
        if exists:
            try:
                await self._label_node(node, expected=(404,))
            except ApiException as exc:
                if exc.status != 404:
                    raise
                await self._create_node(node)
        else:
            try:
                await self._create_node(node, expected=(409,))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                await self._label_node(node)
        return await self._patch_node_status(node, status)

    async def _create_node(self, node: str, *, expected: Expected = ()) -> None:
        body = {
            "apiVersion": names.API_VERSION,
            "kind": names.NODE_KIND,
            "metadata": {"name": node, "labels": {names.LABEL_NODE: node}},
        }
        await self._writes.call(
            "create_vnpunode",
            self.custom.create_cluster_custom_object,
            names.GROUP,
            names.VERSION,
            names.NODE_PLURAL,
            body,
            expected=expected,
        )

    async def _label_node(self, node: str, *, expected: Expected = ()) -> None:
        await self._writes.call(
            "patch_vnpunode",
            self.custom.patch_cluster_custom_object,
            names.GROUP,
            names.VERSION,
            names.NODE_PLURAL,
            node,
            {"metadata": {"labels": {names.LABEL_NODE: node}}},
            _content_type=MERGE,
            expected=expected,
        )

    async def _patch_node_status(
        self, node: str, status: dict[str, Any], *, expected: Expected = ()
    ) -> Raw:
        # The answer is read (unlike other writes): it is what the server
        # made of this status, which the VNPUNode watch compares against.
        obj: Raw = await self._writes.call_json(
            "patch_vnpunode_status",
            self.custom.patch_cluster_custom_object_status,
            names.GROUP,
            names.VERSION,
            names.NODE_PLURAL,
            node,
            {"status": status},
            _content_type=MERGE,
            expected=expected,
        )
        return obj

    async def renew_lease(self, node: str, duration: int) -> None:
        now = dt.datetime.now(dt.UTC)
        name = names.lease_name(node)
        spec = client.V1LeaseSpec(
            holder_identity=node, lease_duration_seconds=duration, renew_time=now
        )
        try:
            await self._writes.call(
                "patch_lease",
                self.coordination.patch_namespaced_lease,
                name,
                self.namespace,
                {
                    "spec": {
                        "holderIdentity": node,
                        "leaseDurationSeconds": duration,
                        "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    }
                },
                _content_type=MERGE,
                expected=(404,),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            spec.acquire_time = now
            await self._writes.call(
                "create_lease",
                self.coordination.create_namespaced_lease,
                self.namespace,
                client.V1Lease(
                    metadata=client.V1ObjectMeta(name=name, labels={names.LABEL_NODE: node}),
                    spec=spec,
                ),
            )

    async def event(
        self,
        involved: Raw,
        *,
        type_: str,
        reason: str,
        message: str,
        node: str,
    ) -> None:
        """Best effort: a lost Event must never fail the work it reports."""
        body = event_body(
            involved,
            reason=reason,
            message=message,
            warning=type_ == "Warning",
            component="vnpu-agent",
            host=node,
            reporting_component="vnpu.io/agent",
        )
        namespace = body["metadata"]["namespace"]
        try:
            await self._writes.call(
                "create_event", self.core.create_namespaced_event, namespace, body
            )
        except ApiException as exc:
            log.warning("could not record event %s on %s: %s", reason,
                        body["involvedObject"]["name"], exc.reason)  # fmt: skip
