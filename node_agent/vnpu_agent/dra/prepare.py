"""What the kubelet plugin does, without gRPC: prepare a node's claims (check
each allocated device's VNPUAllocation, write its CDI spec and its request's
KEP-5304 metadata file), unprepare them, and remember which are prepared
across restarts and reboots (checkpoint.py; docs/DRA.md, "The kubelet
plugin", "What the container sees").

A device is prepared only from a VNPUAllocation that is Ready on this node:
this never creates a vNPU. The plugin is the last line of defense against one
vNPU for two workloads (upstream's kubeletplugin docs say so of every
driver): a Prepare is refused when its vNPU is named by another prepared
claim or another allocation of the node, or is not on the driver.

A claim holds its vNPUs (`holds`, what the allocation server asks before a
destroy, serving.py) from the moment a Prepare naming it is called until the
kubelet unprepares it: a Prepare in flight counts as prepared, in memory
before it waits for the lock and on disk (phase one) before its first read.
`on_unprepared` says when to ask again.

Calls are serialized by one lock and bounded by `budget` seconds (the kubelet
gives each call 45 s and retries), API reads by `api_timeout` seconds each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_agent import cdi
from vnpu_agent.allocation import AllocationView
from vnpu_agent.dra import metadata
from vnpu_agent.dra.checkpoint import COMPLETED, STARTED, Checkpoint, Entry
from vnpu_agent.dra.checkpoint import ClaimId as ClaimId  # what plugin.py names calls by
from vnpu_agent.dra.checkpoint import PreparedDevice as PreparedDevice
from vnpu_agent.failpoints import failpoint
from vnpu_common.kube.rawcall import call_json, describe
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw

log = logging.getLogger(__name__)

# Within the kubelet's 45 s per call, with room for its own work.
PREPARE_BUDGET_SECONDS = 30.0
API_TIMEOUT_SECONDS = 10.0


class ClaimReader(Protocol):
    """The two reads Prepare makes; None when the object does not exist."""

    async def resource_claim(self, namespace: str, name: str) -> Raw | None: ...

    async def allocation(self, namespace: str, name: str) -> Raw | None: ...


class ApiClaimReader:
    """ClaimReader on the API server: plain dicts (kubernetes-asyncio may
    have no resource.k8s.io/v1 models), each read bounded by `timeout`."""

    def __init__(self, api_client: client.ApiClient, timeout: float = API_TIMEOUT_SECONDS):
        self.api = client.CustomObjectsApi(api_client)
        self.timeout = timeout

    async def _get(self, group: str, version: str, namespace: str, plural: str, name: str) -> Any:
        try:
            return await call_json(
                self.api.get_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                name,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def resource_claim(self, namespace: str, name: str) -> Raw | None:
        group, _, version = names.RESOURCE_API.partition("/")
        obj: Raw | None = await self._get(group, version, namespace, "resourceclaims", name)
        return obj

    async def allocation(self, namespace: str, name: str) -> Raw | None:
        obj: Raw | None = await self._get(
            names.GROUP, names.VERSION, namespace, names.ALLOCATION_PLURAL, name
        )
        return obj


@dataclass(slots=True)
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class PrepareError(Exception):
    """A claim that cannot be prepared now; the message is what the kubelet
    reports on the pod (its Events), so it says what to look at."""


class DeviceGuard(Protocol):
    """What Prepare asks of the node's allocation server (serving.py): the
    plugin is the last line of defense against one vNPU for two workloads."""

    def holders(self, vnpu_id: int, claim_uid: str) -> list[str]:
        """The node's other allocations (of another claim or pod, live or
        being released) that name `vnpu_id`."""
        ...

    async def present(self, vnpu_id: int, chip: int, template: str) -> bool:
        """Whether the vNPU exists on the driver as that chip and template."""
        ...


# Prepare's observer: (operation, seconds, claims that failed).
Observe = Callable[[str, float, int], None]


class Preparer:
    """The node's prepared claims: Prepare, Unprepare and what they hold."""

    def __init__(
        self,
        node: str,
        reader: ClaimReader,
        checkpoint_path: Path,
        cdi_dir: Path,
        host_device_dir: Path = cdi.HOST_DEVICE_DIR,
        *,
        budget: float = PREPARE_BUDGET_SECONDS,
        guard: DeviceGuard | None = None,
        boot_id: str | None = None,
        observe: Observe | None = None,
        metadata_dir: Path | None = None,
    ) -> None:
        """`guard`: the node's allocations and vNPUs (for_node always gives
        it; without one, as in tests of the gRPC side alone, Prepare checks
        only the API objects). `boot_id`: this boot's, read from the kernel
        unless given. `metadata_dir`: where the requests' metadata files go;
        the specs mount them from that path, so it must be the same path on
        the host (for_node gives the plugin's own directory; the default,
        beside the checkpoint, is for tests)."""
        self.node = node
        self.reader = reader
        self.cdi_dir = cdi_dir
        self.host_device_dir = host_device_dir
        self.metadata_dir = (
            metadata_dir
            if metadata_dir is not None
            else checkpoint_path.parent / names.DRA_METADATA_HOST_SUBDIR
        )
        # A chip's model, for the metadata files (the driver's view knows it);
        # without it, or where it answers None, the files leave it out.
        self.chip_model: Callable[[int], str | None] | None = None
        self.budget = budget
        self.guard = guard
        self.observe = observe
        self.checkpoint = Checkpoint(checkpoint_path, boot_id)
        self.lock = asyncio.Lock()
        self._listeners: list[Callable[[str], None]] = []
        # Claim UID -> Prepare calls naming it that have not returned: marked
        # before the call waits for the lock, so a release deciding meanwhile
        # already finds the claim held.
        self._inflight: dict[str, int] = {}

    # -- what the allocation server asks (serving.PreparedClaims) --------------

    def holds(self, claim_uid: str) -> str | None:
        """Why the claim's vNPUs may not be destroyed now, or None: it is
        prepared, a Prepare naming it is under way, or the checkpoint was
        unreadable and the claim has not been seen since."""
        if self._inflight.get(claim_uid):
            return "being prepared"
        return self.checkpoint.held(claim_uid)

    def is_prepared(self, claim_uid: str) -> bool:
        return self.holds(claim_uid) is not None

    def prepared_ids(self) -> set[int]:
        """The vNPU ids that prepared claims of this boot name: referenced,
        whatever the allocations say (the orphan collector's view)."""
        return set(self.checkpoint.held_ids())

    def on_unprepared(self, callback: Callable[[str], None]) -> None:
        """`callback(uid)` whenever a claim stops being held: unprepared, or
        its Prepare ended without preparing it."""
        self._listeners.append(callback)

    def _let_go(self, uids: Iterable[str]) -> None:
        for uid in uids:
            for callback in self._listeners:
                callback(uid)

    # -- the kubelet's calls --------------------------------------------------

    async def prepare(self, claims: Iterable[ClaimId]) -> dict[str, PrepareResult]:
        """Every claim gets an entry: its devices, or an error."""
        claims = list(claims)
        for c in claims:
            self._inflight[c.uid] = self._inflight.get(c.uid, 0) + 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            results = await self._prepare_all(claims, started + self.budget)
        finally:
            for c in claims:
                left = self._inflight.get(c.uid, 1) - 1
                if left > 0:
                    self._inflight[c.uid] = left
                else:
                    self._inflight.pop(c.uid, None)
        failed = [uid for uid, r in results.items() if r.error]
        if self.observe is not None:
            self.observe("prepare", loop.time() - started, len(failed))
        # A release deferred while the Prepare ran may go on now.
        self._let_go(uid for uid in failed if not self.is_prepared(uid))
        return results

    async def _prepare_all(
        self, claims: list[ClaimId], deadline: float
    ) -> dict[str, PrepareResult]:
        results = {c.uid: PrepareResult(error="not attempted") for c in claims}
        try:
            async with asyncio.timeout_at(deadline):
                await self.lock.acquire()
        except TimeoutError:
            for r in results.values():
                r.error = f"another Prepare or Unprepare held the plugin {self.budget:.0f} s"
            return results
        try:
            for claim in claims:
                try:
                    async with asyncio.timeout_at(deadline):
                        devices = await self._prepare_one(claim)
                except TimeoutError:
                    msg = f"claim {claim}: not prepared within {self.budget:.0f} s; retried"
                    results[claim.uid] = PrepareResult(error=msg)
                except PrepareError as exc:
                    results[claim.uid] = PrepareResult(error=str(exc))
                except (ApiException, OSError) as exc:
                    msg = f"claim {claim}: {describe(exc)}; retried"
                    results[claim.uid] = PrepareResult(error=msg)
                except Exception as exc:  # never fail the other claims of the call
                    log.exception("Prepare of claim %s failed", claim)
                    results[claim.uid] = PrepareResult(error=f"claim {claim}: {exc!r}")
                else:
                    results[claim.uid] = PrepareResult(devices=devices)
                if results[claim.uid].error:
                    self._abandon(claim.uid)
                    log.warning("Prepare refused: %s", results[claim.uid].error)
        finally:
            self.lock.release()
        return results

    async def unprepare(self, claims: Iterable[ClaimId]) -> dict[str, str]:
        """Claim UID -> error ("" when done). A claim never prepared here
        (or already unprepared) is done."""
        claims = list(claims)
        results = dict.fromkeys((c.uid for c in claims), "")
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.budget):
                await self.lock.acquire()
        except TimeoutError:
            # Counted like any failed call: vnpu_agent_dra_prepare_errors_total,
            # which VNPUDRAPrepareErrors alerts on, must see a plugin stuck here.
            results = dict.fromkeys(results, "another Prepare or Unprepare held the plugin")
            if self.observe is not None:
                self.observe("unprepare", loop.time() - started, len(results))
            return results
        gone: list[str] = []
        try:
            broken = self.checkpoint.broken
            for claim in claims:
                entry = self.checkpoint.entries.pop(claim.uid, None)
                if broken:
                    self.checkpoint.settled.add(claim.uid)
                if entry is None:
                    if broken:
                        gone.append(claim.uid)
                    continue
                for d in entry.devices:
                    cdi.remove_claim(self.cdi_dir, claim.uid, d.device)
                metadata.remove(self.metadata_dir, claim)
                gone.append(claim.uid)
            if gone:
                try:
                    self.checkpoint.save()
                except OSError as exc:
                    for uid in gone:
                        results[uid] = f"writing the DRA checkpoint failed: {exc}"
                    gone = []
                else:
                    log.info("unprepared claim(s) %s", ", ".join(gone))
        finally:
            self.lock.release()
        if self.observe is not None:
            failed = sum(1 for e in results.values() if e)
            self.observe("unprepare", loop.time() - started, failed)
        self._let_go(gone)
        return results

    # -- one claim ------------------------------------------------------------

    def _abandon(self, uid: str) -> None:
        """A Prepare that did not prepare the claim leaves no entry of its own
        (a completed one of an earlier call stays)."""
        entry = self.checkpoint.entries.get(uid)
        if entry is None or (entry.phase == COMPLETED and entry.boot_id == self.checkpoint.boot_id):
            return
        del self.checkpoint.entries[uid]
        for d in entry.devices:
            cdi.remove_claim(self.cdi_dir, uid, d.device)
        metadata.remove(self.metadata_dir, entry.claim)
        try:
            self.checkpoint.save()
        except OSError as exc:
            # Kept on disk as started: it still counts as prepared after a
            # restart, the safe side, until the kubelet unprepares it.
            log.error("DRA checkpoint: dropping claim %s failed: %s", uid, exc)

    async def _prepare_one(self, claim: ClaimId) -> list[PreparedDevice]:
        entry = self.checkpoint.current(claim.uid)
        if entry is not None and entry.phase == COMPLETED:
            # Prepared before in this boot (a retry, or the kubelet's restart):
            # the same answer once its vNPUs are there, specs and metadata put back.
            await self._check_present(claim, entry.devices)
            pod_claim = await self._recorded_pod_claim_name(claim, entry.devices)
            self._write_specs(claim, entry.devices, pod_claim)
            return entry.devices
        # Started (phase one) before any read: a release deciding from here on
        # finds the claim held, across a crash of the agent too.
        self.checkpoint.entries[claim.uid] = Entry(claim, STARTED, self.checkpoint.boot_id)
        self.checkpoint.save()
        await failpoint("dra-prepare-started")
        obj = await self.reader.resource_claim(claim.namespace, claim.name)
        if obj is None:
            raise PrepareError(f"ResourceClaim {claim.namespace}/{claim.name} not found")
        uid = (obj.get("metadata") or {}).get("uid")
        if uid != claim.uid:
            raise PrepareError(
                f"ResourceClaim {claim.namespace}/{claim.name} has UID {uid}, not {claim.uid}: "
                "it was deleted and created again"
            )
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"ResourceClaim {claim} is not allocated")
        devices: list[PreparedDevice] = []
        problems: list[str] = []
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != names.DRA_DRIVER or result.get("pool") != self.node:
                continue
            try:
                devices.append(await self._device(claim, result))
            except PrepareError as exc:
                problems.append(str(exc))
        await failpoint("dra-prepare-after-reads")
        if not problems:
            problems = self._overlaps(claim, devices)
        if problems:
            raise PrepareError(f"claim {claim}: " + "; ".join(problems))
        await self._check_present(claim, devices)
        self._write_specs(claim, devices, _pod_claim_name(obj))
        self.checkpoint.entries[claim.uid] = Entry(
            claim, COMPLETED, self.checkpoint.boot_id, devices
        )
        self.checkpoint.settled.add(claim.uid)
        self.checkpoint.save()
        log.info(
            "prepared claim %s: %s",
            claim,
            ", ".join(f"{d.device} (vNPU {d.vnpu_id})" for d in devices) or "no vnpu.io device",
        )
        return devices

    def _overlaps(self, claim: ClaimId, devices: list[PreparedDevice]) -> list[str]:
        """Why a vNPU of `devices` is someone else's: another prepared claim of
        this boot, another allocation of the node (a force-deleted pod's
        containers may still run: its claim stays prepared until the kubelet
        unprepares it), or twice in this claim."""
        problems = []
        held = self.checkpoint.held_ids()
        seen: set[int] = set()
        for d in devices:
            where = f"device {d.device}: vNPU {d.vnpu_id}"
            if d.vnpu_id in seen:
                problems.append(f"{where} is named twice by this claim")
            seen.add(d.vnpu_id)
            other = held.get(d.vnpu_id)
            if other is not None and other != claim.uid:
                problems.append(f"{where} is still prepared for claim {other}; retried")
                continue
            holders = self.guard.holders(d.vnpu_id, claim.uid) if self.guard else []
            if holders:
                problems.append(
                    f"{where} is still held by allocation {', '.join(sorted(holders))}; retried"
                )
        return problems

    async def _check_present(self, claim: ClaimId, devices: list[PreparedDevice]) -> None:
        if self.guard is None:
            return
        missing = [
            d
            for d in devices
            if d.chip >= 0 and not await self.guard.present(d.vnpu_id, d.chip, d.template)
        ]
        if missing:
            raise PrepareError(
                f"claim {claim}: "
                + ", ".join(f"vNPU {d.vnpu_id} ({d.template})" for d in missing)
                + f" not on {self.node} (after a reboot the agent creates it again); retried"
            )

    async def _device(self, claim: ClaimId, result: Raw) -> PreparedDevice:
        device = str(result.get("device"))
        if result.get("adminAccess"):
            raise PrepareError(
                f"device {device}: admin access to vNPUs is not supported (it would get a "
                "vNPU no quota or counter holds); list them with kubectl get vnpuallocations"
            )
        name = names.dra_allocation_name(claim.uid, device)
        where = f"device {device}: VNPUAllocation {claim.namespace}/{name}"
        obj = await self.reader.allocation(claim.namespace, name)
        if obj is None:
            raise PrepareError(f"{where} not found (the operator has not written it yet)")
        a, status = AllocationView.of(obj), obj.get("status") or {}
        if a.claim_uid != claim.uid:
            raise PrepareError(f"{where} serves another claim")
        if a.node != self.node:
            raise PrepareError(f"{where} is for node {a.node}, not {self.node}")
        if a.deleting:
            raise PrepareError(f"{where} is being deleted")
        phase = a.phase or names.PHASE_PENDING
        if phase != names.PHASE_READY:
            why = f": {status['message']}" if status.get("message") else ""
            raise PrepareError(f"{where} is {phase}, not Ready{why}")
        if a.id is None:
            # The operator always writes one; the schema does not require it.
            raise PrepareError(f"{where} names no vNPU")
        return PreparedDevice(
            request=str(result.get("request")),
            pool=self.node,
            device=device,
            vnpu_id=a.id,
            template=a.template,
            cdi_ids=(cdi.claim_device_id(claim.uid, device),),
            chip=-1 if a.chip is None else a.chip,
        )

    async def _recorded_pod_claim_name(
        self, claim: ClaimId, devices: list[PreparedDevice]
    ) -> str | None:
        """The claim's name in its pod as the first Prepare's metadata files
        recorded it; read from the claim when they are gone (or an agent that
        wrote none prepared it), the one API read a retry may make."""
        if not devices:
            return None
        for d in devices:
            found, name = metadata.recorded_pod_claim_name(
                metadata.host_file(self.metadata_dir, claim, d.request)
            )
            if found:
                return name
        obj = await self.reader.resource_claim(claim.namespace, claim.name)
        if obj is None or (obj.get("metadata") or {}).get("uid") != claim.uid:
            raise PrepareError(
                f"ResourceClaim {claim}: gone or made again since it was prepared; retried"
            )
        return _pod_claim_name(obj)

    def _write_specs(
        self, claim: ClaimId, devices: list[PreparedDevice], pod_claim_name: str | None
    ) -> None:
        """Per request: its metadata file first (a spec never mounts a file
        that is not there), then its devices' specs, each with the request's
        env and that file's mount (cdi.claim_env, cdi.metadata_mount)."""
        requests: dict[str, list[PreparedDevice]] = {}
        for d in devices:
            requests.setdefault(metadata.base_request(d.request), []).append(d)
        model = self.chip_model or (lambda _chip: None)
        for request, served in requests.items():
            host = metadata.host_file(self.metadata_dir, claim, request)
            text = metadata.document(claim, pod_claim_name, served[0].request, served, model)
            metadata.write(host, text)
            container = metadata.container_file(claim, pod_claim_name, request)
            mount = cdi.metadata_mount(host, container)
            ids = [d.vnpu_id for d in served]
            for d in served:
                cdi.write_claim(self.cdi_dir, claim.uid, d.device, d.vnpu_id, d.template,
                                self.host_device_dir, ids, mount)  # fmt: skip


def _pod_claim_name(claim: Raw) -> str | None:
    """The claim's entry name in its pod when a template made it (the claim's
    own name is generated; the pod spec knows the entry's)."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(names.DRA_POD_CLAIM_NAME_ANNOTATION)
    return value if isinstance(value, str) and value else None
