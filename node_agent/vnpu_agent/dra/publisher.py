"""The DRA node's ResourceSlice pool, kept as the node's chips say (--dra).

`PoolPublisher.update` is told the chips and cordons each time the VNPUNode
status is built (publisher.NodePublisher); the pool (dra/slices.py) depends
only on the chips' identity, health, totals and templates and on the cordons,
never on the vNPUs present, so a vNPU created or destroyed writes nothing.
When the pool the chips make differs from the last one written, `run` reads
the pool's slices from the API server and, if they differ, writes all of them
with the next generation (create or replace each by name, then delete the
surplus). It also reads them back every --dra-verify-seconds and puts them
back if someone else (the kubelet wiping a driver's slices, an admin) changed
or deleted them. A failure is logged and retried with the project's backoff;
it never stops the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from vnpu_agent.dra import slices
from vnpu_common import names
from vnpu_common.api.models import ChipStatus
from vnpu_common.apiwrites import Writes
from vnpu_common.backoff import Backoff
from vnpu_common.rawcall import call_json, describe
from vnpu_common.types import Raw

log = logging.getLogger(__name__)


class ResourceApiMissingError(RuntimeError):
    """The API server does not serve resource.k8s.io/v1 ResourceSlices."""


class SliceApi:
    """The pool's reads and writes: ResourceSlices of driver vnpu.io in one
    node's pool, and the Node's uid (their owner). Raw calls (rawcall): the
    answers stay plain dicts, and the client's models of resource.k8s.io/v1
    are never built. Failed writes are counted in the agent's
    vnpu_agent_api_errors_total."""

    def __init__(self, api_client: client.ApiClient, errors: Counter) -> None:
        self._writes = Writes(errors)
        self.resource = client.ResourceV1Api(api_client)
        self.core = client.CoreV1Api(api_client)

    async def check_served(self) -> None:
        """Raises ResourceApiMissingError when the API server does not serve
        ResourceSlices in resource.k8s.io/v1 (Kubernetes < 1.34, or the
        group turned off)."""
        try:
            found = await call_json(self.resource.get_api_resources)
        except ApiException as exc:
            if exc.status != 404:
                raise
            found = {}
        if not any(r.get("name") == slices.PLURAL for r in found.get("resources") or []):
            raise ResourceApiMissingError(
                f"--dra needs the API server to serve {names.RESOURCE_API} ResourceSlices "
                "(Kubernetes 1.34 or later; partitionable devices and binding conditions, "
                "which the pool uses, from 1.36), and it does not: run the agent without "
                "--dra (chart value agent.dra=false) or upgrade the cluster (docs/DRA.md)"
            )

    async def node_uid(self, node: str) -> str:
        obj = await call_json(self.core.read_node, node)
        return str(obj["metadata"]["uid"])

    async def list_pool(self, node: str) -> list[Raw]:
        """The slices of driver vnpu.io on `node` whose pool is the node's.
        By spec.nodeName: Kubernetes 1.34 knows no field selector on
        spec.pool.name."""
        found = await call_json(
            self.resource.list_resource_slice,
            field_selector=f"spec.driver={names.DRA_DRIVER},spec.nodeName={node}",
        )
        return [
            s
            for s in found.get("items") or []
            if ((s.get("spec") or {}).get("pool") or {}).get("name") == node
        ]

    async def create(self, body: Raw) -> Raw:
        written: Raw = await self._writes.call_json(
            "create_resourceslice", self.resource.create_resource_slice, body
        )
        return written

    async def replace(self, body: Raw) -> Raw:
        written: Raw = await self._writes.call_json(
            "replace_resourceslice",
            self.resource.replace_resource_slice,
            body["metadata"]["name"],
            body,
        )
        return written

    async def delete(self, name: str) -> None:
        try:
            await self._writes.call(
                "delete_resourceslice", self.resource.delete_resource_slice, name, expected=(404,)
            )
        except ApiException as exc:
            if exc.status != 404:
                raise


def comparable(pool: Iterable[Raw]) -> dict[str, Any]:
    """What of a pool's slices the agent decides, by slice name: the owner
    and the spec without the generation (bumped on every write) and without
    what the server adds (a taint's timeAdded)."""
    out: dict[str, Any] = {}
    for s in pool:
        meta = s.get("metadata") or {}
        spec = copy.deepcopy(s.get("spec") or {})
        (spec.get("pool") or {}).pop("generation", None)
        for device in spec.get("devices") or []:
            for taint in device.get("taints") or []:
                taint.pop("timeAdded", None)
        owners = [
            (o.get("kind"), o.get("name"), o.get("uid")) for o in meta.get("ownerReferences") or []
        ]
        out[str(meta.get("name"))] = (owners, spec)
    return out


def _generations(pool: Iterable[Raw]) -> set[int]:
    return {int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0)) for s in pool}


class PoolPublisher:
    """One node's pool: `update` from the VNPUNode publisher, `run` as a task."""

    def __init__(
        self,
        node: str,
        api: SliceApi,
        *,
        retry_max_seconds: float,
        verify_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self.node = node
        self.api = api
        self.verify_seconds = verify_seconds
        self.clock = clock
        self._backoff = Backoff(base=1.0, cap=retry_max_seconds)
        self._failures = 0
        self._wake = asyncio.Event()
        # The chips and cordons last told, and the pool they make (at
        # generation 0, no owner): what `update` compares.
        self._chips: list[ChipStatus] | None = None
        self._cordoned: list[int] = []
        self._wanted: list[Raw] | None = None
        # The pool last written (comparable()) and the server's answers to
        # that write: an API server that drops fields it does not know
        # (feature gates off) answers with less than was written.
        self._written: dict[str, Any] | None = None
        self._answered: dict[str, Any] | None = None
        self._warned_dropped = False
        self.generation: int | None = None  # of the pool in the API, once read or written

    def update(self, chips: Sequence[ChipStatus], cordoned: Iterable[int]) -> None:
        """The node's chips (as the VNPUNode status lists them) and cordoned
        chips now; wakes `run` when the pool they make changed."""
        chips = list(chips)
        cordoned = sorted(set(cordoned))
        wanted = slices.pool_slices(chips, cordoned, self.node, 0)
        if wanted == self._wanted:
            return
        self._chips, self._cordoned, self._wanted = chips, cordoned, wanted
        self._wake.set()

    def recheck(self) -> None:
        """Reads the pool back now and puts it back if it is not as written:
        for whoever knows the slices may be gone before the next periodic
        read (the kubelet deletes a driver's slices while its plugin is not
        registered)."""
        if self._chips is not None:
            self._wake.set()

    async def run(self) -> None:
        while True:
            if self._failures:
                wait = self._backoff.delay(self._failures)
            elif self._chips is None:
                wait = None  # nothing to publish before the chips are known
            else:
                wait = self.verify_seconds
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            self._wake.clear()
            if self._chips is None:
                continue
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failures += 1
                log.error(
                    "ResourceSlices of %s not published (%s); trying again shortly",
                    self.node,
                    describe(exc),
                )
            else:
                self._failures = 0

    async def sync(self) -> None:
        """Makes the pool in the API server the one the chips last told make."""
        assert self._chips is not None
        chips, cordoned = self._chips, self._cordoned
        uid = await self.api.node_uid(self.node)
        existing = await self.api.list_pool(self.node)
        want = slices.pool_slices(chips, cordoned, self.node, 0, node_uid=uid)
        if self._holds(existing, want):
            self.generation = max(_generations(existing), default=0)
            return
        generation = max(_generations(existing), default=0) + 1
        pool = slices.pool_slices(chips, cordoned, self.node, generation, node_uid=uid)
        by_name = {str(s["metadata"]["name"]): s for s in existing}
        answers = []
        for body in pool:
            old = by_name.pop(body["metadata"]["name"], None)
            if old is None:
                answers.append(await self.api.create(body))
            else:
                body["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                answers.append(await self.api.replace(body))
        for name in sorted(by_name):
            await self.api.delete(name)
        self._written, self._answered = comparable(want), comparable(answers)
        self.generation = generation
        log.info(
            "published %d ResourceSlice(s) of %s at generation %d",
            len(pool),
            self.node,
            generation,
        )
        self._warn_dropped(pool, answers)

    def _holds(self, existing: list[Raw], want: list[Raw]) -> bool:
        """Whether the slices in the API are `want`, all of one generation:
        as written, or as the server answered our last write of it."""
        if len(_generations(existing)) > 1:
            return False
        found = comparable(existing)
        if found == comparable(want):
            return True
        return self._written == comparable(want) and found == self._answered

    def _warn_dropped(self, pool: list[Raw], answers: list[Raw]) -> None:
        if self._warned_dropped:
            return
        dropped = sorted(
            {
                field
                for body, answer in zip(pool, answers, strict=True)
                for field in ("sharedCounters", "devices")
                if body["spec"].get(field) and not (answer.get("spec") or {}).get(field)
            }
            | {
                field
                for answer in answers
                for device in (answer.get("spec") or {}).get("devices") or []
                for field in ("consumesCounters", "bindingConditions")
                if not device.get(field)
            }
        )
        if dropped:
            self._warned_dropped = True
            log.warning(
                "the API server dropped %s from the ResourceSlices of %s: its DRA features "
                "for partitionable devices and binding conditions are off (on by default "
                "from Kubernetes 1.36); the scheduler cannot share a chip's counters or "
                "wait for the vNPU (docs/DRA.md)",
                ", ".join(dropped),
                self.node,
            )
