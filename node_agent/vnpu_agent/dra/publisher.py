"""The DRA node's ResourceSlice pool, kept as the node's chips say (--dra).

`PoolPublisher.update` is told the chips, the cordons and the capacity held
outside the scheduler's view (slices.held_capacity) each time the VNPUNode
status is built and each time an allocation of the node changes
(publisher.NodePublisher); the pool (dra/slices.py) depends on the chips'
identity, health, totals and templates, the cordons and what is held, never
on the vNPUs of live claims, so a vNPU created or destroyed for one writes
nothing. When the pool they make differs from the last one written, `run`
reads the pool's slices from the API server and, if they differ, writes all
of them with the next generation (create or replace each by name, then
delete the surplus).

Put back when someone else changes or deletes them: the kubelet deletes a
node's slices at its start and a driver's 30 s after its plugin left, and an
admin may. The agent watches its pools' slices (one watch per process,
`SliceWatcher`, field selector spec.driver and, for one node, spec.nodeName,
as Go's resourceslice controller does) and compares what the server holds
with what it wrote a moment after each change that is not its own write's
echo; a difference is repaired within about a second, a repeated one with a
growing delay (a controller fighting us gets a backoff, not a write storm).
The slices are also read back every --dra-verify-seconds, in case the watch
missed something. A failure is logged and retried with the project's
backoff; it never stops the agent.

A node that leaves DRA (its agent started without --dra) has its pool
deleted (`delete_pools`): the scheduler must not allocate from chips the
annotation path now books.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from vnpu_agent.dra import slices
from vnpu_common.kube.apiwrites import Writes
from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.faults import log_retry
from vnpu_common.kube.informer import DELETED, Informer
from vnpu_common.kube.rawcall import call_json, describe
from vnpu_common.wire import names
from vnpu_common.wire.models import ChipStatus
from vnpu_common.wire.types import Raw

log = logging.getLogger(__name__)

# After a change of the pool that is not our write's echo, how long the watch
# is let settle before the server's slices are compared with ours (a wipe
# deletes them one by one; an edit may come in several writes).
REPAIR_SETTLE_SECONDS: Final = 0.5
# A repair this long after the previous one is a new incident: its delay
# starts from nothing again. Within it, each repair waits twice the last.
REPAIR_QUIET_SECONDS: Final = 60.0
# The write operations of vnpu_agent_dra_pool_writes_total.
OP_CREATE, OP_UPDATE, OP_DELETE = "create", "update", "delete"


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

    def list_call(self, nodes: Collection[str]) -> Callable[..., Any]:
        """The list (and watch) of the driver's slices, on the node's name
        when there is one node (the DaemonSet); for many (simulated nodes)
        all of the driver's, each handed to its node by the pool's name."""
        selector = f"spec.driver={names.DRA_DRIVER}"
        if len(nodes) == 1:
            selector += f",spec.nodeName={next(iter(nodes))}"
        return partial(self.resource.list_resource_slice, field_selector=selector)

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
    """One node's pool: `update` from the VNPUNode publisher, `run` as a task,
    `on_slice_event` from the process's SliceWatcher."""

    def __init__(
        self,
        node: str,
        api: SliceApi,
        *,
        retry_max_seconds: float,
        verify_seconds: float,
        clock: Callable[[], float],
        written: Callable[[str], None] = lambda _op: None,
    ) -> None:
        """`written(op)` once per slice written (op: create, update, delete):
        the agent's vnpu_agent_dra_pool_writes_total."""
        self.node = node
        self.api = api
        self.verify_seconds = verify_seconds
        self.clock = clock
        self.written = written
        self._backoff = Backoff(base=1.0, cap=retry_max_seconds)
        self._failures = 0
        self._wake = asyncio.Event()
        # The chips, cordons and held capacity last told, and the pool they
        # make (at generation 0, no owner): what `update` compares.
        self._chips: list[ChipStatus] | None = None
        self._told: Sequence[ChipStatus] | None = None  # the very object last told
        self._cordoned: list[int] = []
        self._held: dict[int, slices.Held] = {}
        self._wanted: list[Raw] | None = None
        # The pool last written (comparable()) and the server's answers to
        # that write: an API server that drops fields it does not know
        # (feature gates off) answers with less than was written.
        self._written: dict[str, Any] | None = None
        self._answered: dict[str, Any] | None = None
        self._warned_dropped = False
        self.generation: int | None = None  # of the pool in the API, once read or written
        # The pool's slices as the watch last showed them, by name; the
        # resourceVersions our last write's answers carry (their echoes).
        self.seen: dict[str, Raw] = {}
        self._ours: set[str] = set()
        self._uid: str | None = None  # the Node's, as the last write owned the slices
        self._syncing = False
        self._check: asyncio.TimerHandle | None = None
        # Repairs of a pool someone else changed: how many in a row, when the
        # last one was, and the one waiting for its delay.
        self.repairs = 0
        self._last_repair = -1e9
        self._repair: asyncio.TimerHandle | None = None
        # Whether the API server holds the pool last told, as far as this
        # agent knows: the last sync wrote or confirmed it and the watch has
        # shown no difference since (vnpu_agent_dra_pool_published). False
        # before the chips are known, after a failed sync and while a pool
        # someone else changed or deleted waits for its repair.
        self.published = False

    def update(
        self,
        chips: Sequence[ChipStatus],
        cordoned: Iterable[int],
        held: Mapping[int, slices.Held] | None = None,
    ) -> None:
        """The node's chips (as the VNPUNode status lists them), cordoned
        chips and held capacity now; wakes `run` when the pool they make
        changed."""
        cordoned = sorted(set(cordoned))
        held = dict(held or {})
        if chips is self._told and cordoned == self._cordoned and held == self._held:
            # The same chips as last time (an allocation event between two
            # statuses): nothing the pool depends on moved; no slices built.
            return
        self._told = chips
        chips = list(chips)
        wanted = slices.pool_slices(chips, cordoned, self.node, 0, held=held)
        if wanted == self._wanted:
            return
        self._chips, self._cordoned, self._held, self._wanted = chips, cordoned, held, wanted
        self._wake.set()

    @property
    def chips(self) -> list[ChipStatus] | None:
        """The chips last told (None before the first status)."""
        return self._chips

    @property
    def cordoned(self) -> list[int]:
        return self._cordoned

    def recheck(self) -> None:
        """Reads the pool back now and puts it back if it is not as written:
        for whoever knows the slices may be gone before the next periodic
        read (the kubelet deletes a driver's slices while its plugin is not
        registered)."""
        if self._chips is not None:
            self._wake.set()

    # -- the watch of the pool's slices ----------------------------------------

    async def on_slice_event(self, kind: str, obj: Raw) -> None:
        """An event of the watch of the node's slices (SYNC after a list)."""
        name = str((obj.get("metadata") or {}).get("name"))
        if kind == DELETED:
            self.seen.pop(name, None)
        else:
            self.seen[name] = obj
            if (obj.get("metadata") or {}).get("resourceVersion") in self._ours:
                return  # our own write's echo
        if self._check is None:
            loop = asyncio.get_running_loop()
            self._check = loop.call_later(REPAIR_SETTLE_SECONDS, self._compare)

    def _compare(self) -> None:
        """Whether the slices the watch shows are the pool last written; if
        not, a repair (after its delay)."""
        self._check = None
        if self._chips is None or self._written is None or self._syncing:
            # Nothing written yet (the first sync reads the server anyway), or
            # a write in flight: `run` compares again once it is done.
            return
        want = slices.pool_slices(
            self._chips, self._cordoned, self.node, 0, node_uid=self._uid, held=self._held
        )
        if self._written != comparable(want):
            return  # our own change, not written yet: `run` is awake for it
        if not self._holds(list(self.seen.values()), want):
            self.published = False
            self._schedule_repair()

    def _schedule_repair(self) -> None:
        if self._repair is not None:
            return
        now = self.clock()
        if now - self._last_repair > REPAIR_QUIET_SECONDS:
            self.repairs = 0
        # The first repair of an incident at once (a kubelet wipe must not
        # leave the node without a pool); each further one within the quiet
        # period twice as late as the last, to the retry cap.
        delay = 0.0 if self.repairs == 0 else self._backoff.delay(self.repairs)
        self.repairs += 1
        self._last_repair = now
        log.warning(
            "ResourceSlices of %s changed or deleted by someone else; putting them back%s",
            self.node,
            f" in {delay:.1f}s" if delay else "",
        )
        self._repair = asyncio.get_running_loop().call_later(delay, self._repair_now)

    def _repair_now(self) -> None:
        self._repair = None
        self._wake.set()

    # -- writing ---------------------------------------------------------------

    async def run(self) -> None:
        retry_in = 0.0  # the backoff after the last failure, drawn as it is logged
        while True:
            if self._failures:
                wait = retry_in
            elif self._chips is None:
                wait = None  # nothing to publish before the chips are known
            else:
                wait = self.verify_seconds
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            self._wake.clear()
            if self._chips is None:
                continue
            self._syncing = True
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failures += 1
                self.published = False
                retry_in = self._backoff.delay(self._failures)
                log_retry(log, f"publishing the ResourceSlices of {self.node}", exc, retry_in)
            else:
                self._failures = 0
            finally:
                self._syncing = False
            if self._check is None and self._written is not None:
                # Changes the watch showed while we wrote were not compared.
                self._check = asyncio.get_running_loop().call_later(
                    REPAIR_SETTLE_SECONDS, self._compare
                )

    async def sync(self) -> None:
        """Makes the pool in the API server the one last told."""
        assert self._chips is not None
        chips, cordoned, held = self._chips, self._cordoned, self._held
        uid = await self.api.node_uid(self.node)
        existing = await self.api.list_pool(self.node)
        want = slices.pool_slices(chips, cordoned, self.node, 0, node_uid=uid, held=held)
        if self._holds(existing, want):
            self.generation = max(_generations(existing), default=0)
            if comparable(existing) == comparable(want):
                # Adopted as it stands (an agent restart, or our change made
                # by someone else): what the watch is compared with from now.
                self._written = self._answered = comparable(want)
                self._uid = uid
            self.published = True
            return
        # Above any generation the pool had, the one we last wrote included:
        # after a wipe (nothing left to read it from), a consumer whose watch
        # still shows the old slices must see the new ones as newer.
        generation = max(*_generations(existing), self.generation or 0, 0) + 1
        pool = slices.pool_slices(chips, cordoned, self.node, generation, node_uid=uid, held=held)
        by_name = {str(s["metadata"]["name"]): s for s in existing}
        answers = []
        self._ours = set()
        for body in pool:
            old = by_name.pop(body["metadata"]["name"], None)
            if old is None:
                answer = await self.api.create(body)
                self.written(OP_CREATE)
            else:
                body["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                answer = await self.api.replace(body)
                self.written(OP_UPDATE)
            answers.append(answer)
            self._ours.add(str((answer.get("metadata") or {}).get("resourceVersion")))
        for name in sorted(by_name):
            await self.api.delete(name)
            self.written(OP_DELETE)
        self._written, self._answered = comparable(want), comparable(answers)
        self._uid = uid
        self.generation = generation
        self.published = True
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


class SliceWatcher(Informer):
    """The watch of this process's pools' slices: one list-then-watch, each
    event handed to the PoolPublisher of the slice's pool (its node).
    Slices of other nodes (many simulated nodes watch the whole driver) are
    not kept."""

    def __init__(
        self,
        api: SliceApi,
        pools: Mapping[str, PoolPublisher],
        *,
        timeout_seconds: int = 300,
        retry_max_seconds: float = 30.0,
    ) -> None:
        self.pools = pools
        super().__init__(
            slices.PLURAL,
            api.list_call(list(pools)),
            self._dispatch,
            keep=self._ours,
            timeout_seconds=timeout_seconds,
            retry_max_seconds=retry_max_seconds,
        )

    def _ours(self, obj: Raw) -> Raw | None:
        spec = obj.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name")
        if spec.get("driver") == names.DRA_DRIVER and pool in self.pools:
            return obj
        return None

    async def _dispatch(self, kind: str, obj: Raw) -> None:
        pool = self.pools.get(str(((obj.get("spec") or {}).get("pool") or {}).get("name")))
        if pool is not None:
            await pool.on_slice_event(kind, obj)


async def delete_pools(
    api: SliceApi, nodes: Collection[str], *, written: Callable[[str], None] = lambda _op: None
) -> int:
    """Deletes the pools of `nodes` (an agent started without --dra: the
    node left DRA, and its chips are the annotation path's now). Returns how
    many slices went. A server without resource.k8s.io/v1 (404) or an agent
    not allowed to list them (403: the chart grants it only with agent.dra)
    has nothing to do here: 0, logged at debug."""
    wanted = set(nodes)
    try:
        found = await call_json(api.list_call(wanted))
    except ApiException as exc:
        if exc.status in (403, 404):
            log.debug("ResourceSlices not read (%s): no DRA pool to delete", describe(exc))
            return 0
        raise
    gone = 0
    for s in found.get("items") or []:
        spec = s.get("spec") or {}
        if spec.get("nodeName") in wanted and (spec.get("pool") or {}).get("name") in wanted:
            await api.delete(str(s["metadata"]["name"]))
            written(OP_DELETE)
            gone += 1
    if gone:
        log.warning(
            "deleted %d ResourceSlice(s) of %s: the agent runs without --dra, so the node "
            "no longer serves claims (docs/DRA.md)",
            gone,
            ", ".join(sorted(wanted)),
        )
    return gone
