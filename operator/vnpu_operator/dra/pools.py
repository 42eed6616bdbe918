"""The pools of dead agents: a DRA node whose agent's Lease expired loses its
ResourceSlices, so the scheduler stops choosing its devices.

On a node with a kubelet, the kubelet deletes a driver's slices 30 s after
its plugin goes. Nothing does on a node without one (kwok nodes, an agent
that simulates nodes), and an agent that hangs keeps its plugin registered:
its pool stays published, the scheduler keeps allocating from it, and each
claim waits for a vNPU that cannot come. So the leader deletes them; the
agent publishes its pool again when it is back.

Only what is certainly dead goes: the operator's own view of the Lease
(`NodeInventory.live`) is read again from the server first, so a watch that
fell behind never empties a live node's pool, and each slice is deleted
with the resourceVersion it was listed at, so one the agent republished
meanwhile stays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from vnpu_common.kube.apiwrites import Writes
from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.rawcall import call_json
from vnpu_common.kube.workqueue import RetryLater, WorkQueue
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.leases import parse_time
from vnpu_operator.placement import Ledger

log = logging.getLogger(__name__)

# The queue key that looks at every known node (on taking over, once listed).
SWEEP = ""


class PoolApi:
    """The reads and the one write of dead pools: ResourceSlices of our
    driver on a node, and an agent's Lease (by a list with a name selector:
    the operator may list and watch agent Leases, not get them)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        errors: Counter,
        fence: Callable[[str], None] | None = None,
    ) -> None:
        """`fence`: as OperatorApi's (only the leader writes)."""
        self.resource = client.ResourceV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self._writes = Writes(errors, fence)

    async def node_slices(self, node: str) -> list[tuple[str, str]]:
        """(name, resourceVersion) of each ResourceSlice of driver vnpu.io on `node`."""
        selector = f"spec.nodeName={node},spec.driver={names.DRA_DRIVER}"
        got: Raw = await call_json(self.resource.list_resource_slice, field_selector=selector)
        out: list[tuple[str, str]] = []
        for item in got.get("items") or []:
            meta = item.get("metadata") or {}
            if meta.get("name"):
                out.append((str(meta["name"]), str(meta.get("resourceVersion") or "")))
        return out

    async def delete_slice(self, name: str, version: str) -> bool:
        """True if deleted; False if it was gone or changed since `version`
        (its agent published it again)."""
        body: dict[str, Any] = {"preconditions": {"resourceVersion": version}} if version else {}
        try:
            await self._writes.call(
                "delete_resource_slice",
                self.resource.delete_resource_slice,
                name,
                body=body,
                expected=(404, 409),
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def lease(self, namespace: str, name: str) -> Raw | None:
        selector = f"metadata.name={name}"
        got: Raw = await call_json(
            self.coordination.list_namespaced_lease, namespace, field_selector=selector
        )
        items = got.get("items") or []
        return items[0] if items else None


def lease_expiry(lease: Raw | None, grace: float) -> float:
    """When the Lease runs out (epoch seconds), as LeaseLiveness counts it;
    0 for none or one that cannot be read."""
    spec = (lease or {}).get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return 0.0
    return renewed + duration + grace


class DeadPools:
    def __init__(
        self,
        api: PoolApi,
        ledger: Ledger,
        *,
        agent_namespace: str,
        grace_seconds: float,
        retry_max_seconds: float,
        ready: Callable[[], bool] = lambda: True,
        deleted: Counter | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`ready()`: the ledger holds every node (the pod controller's
        caches are synced); `deleted`: counts the slices deleted; `wall`:
        the clock Leases are compared with."""
        self.api = api
        self.ledger = ledger
        self.namespace = agent_namespace
        self.grace = grace_seconds
        self.ready = ready
        self.deleted = deleted
        self.wall = wall
        # Set by the claim controller: only the leader deletes.
        self.leading: Callable[[], bool] = lambda: True
        self.queue = WorkQueue(
            self.reap,
            name="dead-pool",
            backoff=Backoff(base=1.0, cap=retry_max_seconds),
            expected=(ApiException,),
        )

    def node_lost(self, node: str) -> None:
        if self._dead(node):
            self.queue.add(node)

    def sweep(self) -> None:
        """Every DRA node known dead now (on taking over, and once listed:
        nothing tells of an agent that died while no operator led)."""
        self.queue.add(SWEEP)

    def _dead(self, node: str) -> bool:
        inventory = self.ledger.node(node)
        return inventory is not None and inventory.status.dra and not inventory.live

    async def reap(self, node: str) -> None:
        if not self.leading():
            return
        if node == SWEEP:
            if not self.ready():
                raise RetryLater("the operator's caches are not synced yet")
            for name in self.ledger.node_names():
                self.node_lost(name)
            return
        if not self._dead(node):
            return
        lease_name = names.lease_name(node)
        lease = await self.api.lease(self.namespace, lease_name)
        if lease_expiry(lease, self.grace) > self.wall():
            # Renewed after all: the watch is behind, and the Node itself is
            # gone if the inventory is not live (its slices go with it, by
            # their ownerReference).
            return
        for name, version in await self.api.node_slices(node):
            if not self.leading() or not self._dead(node):
                return
            if await self.api.delete_slice(name, version):
                if self.deleted is not None:
                    self.deleted.inc()
                log.warning(
                    "node %s: deleted ResourceSlice %s: the vnpu-agent's Lease %s/%s expired, "
                    "so nothing can serve its devices; the agent publishes them again when back",
                    node, name, self.namespace, lease_name,
                )  # fmt: skip
