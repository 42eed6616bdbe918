"""What the kubelet plugin does, without gRPC: prepare a node's claims (check
each allocated device's VNPUAllocation, write its CDI spec), unprepare them,
and remember which are prepared across restarts (docs/DRA.md, "The kubelet
plugin").

A device is prepared only from a VNPUAllocation that is Ready on this node:
this never creates a vNPU. A claim the kubelet has prepared keeps its vNPU:
`is_prepared` is what the allocation server asks before a destroy
(serving.py), and `on_unprepared` tells it when to ask again.

Calls are serialized by one lock and bounded by `budget` seconds (the kubelet
gives each call 45 s and retries), API reads by `api_timeout` seconds each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_agent import cdi
from vnpu_common import names
from vnpu_common.rawcall import call_json, describe
from vnpu_common.types import Raw

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
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


@dataclass(frozen=True, slots=True)
class ClaimId:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as the checkpoint keeps it."""

    request: str
    pool: str
    device: str
    vnpu_id: int
    template: str
    cdi_ids: tuple[str, ...]


@dataclass(slots=True)
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class PrepareError(Exception):
    """A claim that cannot be prepared now; the message is what the kubelet
    reports on the pod (its Events), so it says what to look at."""


class Checkpoint:
    """The prepared claims, in a JSON file written atomically: what
    Unprepare removes after an agent restart, and what `is_prepared` answers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, tuple[ClaimId, list[PreparedDevice]]] = {}
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Never guess: a checkpoint we cannot read is kept for a person to
            # look at, and the kubelet's Prepare calls rebuild what it held.
            broken = self.path.with_suffix(".broken")
            log.error("DRA checkpoint %s unreadable (%s); moved to %s", self.path, exc, broken)
            with contextlib.suppress(OSError):
                os.replace(self.path, broken)
            return
        if data.get("version") != CHECKPOINT_VERSION:
            raise RuntimeError(
                f"DRA checkpoint {self.path} has version {data.get('version')!r}, "
                f"this agent reads {CHECKPOINT_VERSION}"
            )
        for uid, entry in (data.get("claims") or {}).items():
            claim = ClaimId(entry["namespace"], uid, entry["name"])
            devices = [
                PreparedDevice(
                    request=d["request"],
                    pool=d["pool"],
                    device=d["device"],
                    vnpu_id=int(d["vnpuId"]),
                    template=d["template"],
                    cdi_ids=tuple(d["cdiIds"]),
                )
                for d in entry.get("devices") or []
            ]
            self.claims[uid] = (claim, devices)

    def save(self) -> None:
        claims = {
            uid: {
                "namespace": claim.namespace,
                "name": claim.name,
                "devices": [
                    {
                        "request": d.request,
                        "pool": d.pool,
                        "device": d.device,
                        "vnpuId": d.vnpu_id,
                        "template": d.template,
                        "cdiIds": list(d.cdi_ids),
                    }
                    for d in devices
                ],
            }
            for uid, (claim, devices) in sorted(self.claims.items())
        }
        text = json.dumps({"version": CHECKPOINT_VERSION, "claims": claims}, indent=1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Preparer:
    """The node's prepared claims: Prepare, Unprepare and `is_prepared`."""

    def __init__(
        self,
        node: str,
        reader: ClaimReader,
        checkpoint_path: Path,
        cdi_dir: Path,
        host_device_dir: Path = cdi.HOST_DEVICE_DIR,
        *,
        budget: float = PREPARE_BUDGET_SECONDS,
    ) -> None:
        self.node = node
        self.reader = reader
        self.cdi_dir = cdi_dir
        self.host_device_dir = host_device_dir
        self.budget = budget
        self.checkpoint = Checkpoint(checkpoint_path)
        self.lock = asyncio.Lock()
        self._listeners: list[Callable[[str], None]] = []

    # -- what the allocation server asks (serving.PreparedClaims) --------------

    def is_prepared(self, claim_uid: str) -> bool:
        return claim_uid in self.checkpoint.claims

    def on_unprepared(self, callback: Callable[[str], None]) -> None:
        self._listeners.append(callback)

    # -- the kubelet's calls --------------------------------------------------

    async def prepare(self, claims: Iterable[ClaimId]) -> dict[str, PrepareResult]:
        """Every claim gets an entry: its devices, or an error."""
        claims = list(claims)
        results = {c.uid: PrepareResult(error="not attempted") for c in claims}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget
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
                    log.warning("Prepare refused: %s", results[claim.uid].error)
        finally:
            self.lock.release()
        return results

    async def unprepare(self, claims: Iterable[ClaimId]) -> dict[str, str]:
        """Claim UID -> error ("" when done). A claim never prepared here
        (or already unprepared) is done."""
        claims = list(claims)
        results = dict.fromkeys((c.uid for c in claims), "")
        try:
            async with asyncio.timeout(self.budget):
                await self.lock.acquire()
        except TimeoutError:
            return dict.fromkeys(results, "another Prepare or Unprepare held the plugin")
        gone: list[str] = []
        try:
            for claim in claims:
                entry = self.checkpoint.claims.get(claim.uid)
                if entry is None:
                    continue
                for d in entry[1]:
                    cdi.remove_claim(self.cdi_dir, claim.uid, d.device)
                del self.checkpoint.claims[claim.uid]
                gone.append(claim.uid)
            if gone:
                try:
                    self.checkpoint.save()
                except OSError as exc:
                    for uid in gone:
                        results[uid] = f"writing the DRA checkpoint failed: {exc}"
                    return results
                log.info("unprepared claim(s) %s", ", ".join(gone))
        finally:
            self.lock.release()
        for uid in gone:
            for callback in self._listeners:
                callback(uid)
        return results

    # -- one claim ------------------------------------------------------------

    async def _prepare_one(self, claim: ClaimId) -> list[PreparedDevice]:
        entry = self.checkpoint.claims.get(claim.uid)
        if entry is not None:
            # Prepared before (a retry, or the kubelet's restart): the same
            # answer, its specs put back if someone removed them.
            self._write_specs(claim, entry[1])
            return entry[1]
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
        if problems:
            raise PrepareError(f"claim {claim}: " + "; ".join(problems))
        self._write_specs(claim, devices)
        self.checkpoint.claims[claim.uid] = (claim, devices)
        try:
            self.checkpoint.save()
        except OSError:
            del self.checkpoint.claims[claim.uid]
            for d in devices:
                cdi.remove_claim(self.cdi_dir, claim.uid, d.device)
            raise
        log.info(
            "prepared claim %s: %s",
            claim,
            ", ".join(f"{d.device} (vNPU {d.vnpu_id})" for d in devices) or "no vnpu.io device",
        )
        return devices

    async def _device(self, claim: ClaimId, result: Raw) -> PreparedDevice:
        device = str(result.get("device"))
        name = names.dra_allocation_name(claim.uid, device)
        where = f"device {device}: VNPUAllocation {claim.namespace}/{name}"
        obj = await self.reader.allocation(claim.namespace, name)
        if obj is None:
            raise PrepareError(f"{where} not found (the operator has not written it yet)")
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if (spec.get("claim") or {}).get("uid") != claim.uid:
            raise PrepareError(f"{where} serves another claim")
        if spec.get("nodeName") != self.node:
            raise PrepareError(f"{where} is for node {spec.get('nodeName')}, not {self.node}")
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise PrepareError(f"{where} is being deleted")
        phase = status.get("phase") or names.PHASE_PENDING
        if phase != names.PHASE_READY:
            why = f": {status['message']}" if status.get("message") else ""
            raise PrepareError(f"{where} is {phase}, not Ready{why}")
        return PreparedDevice(
            request=str(result.get("request")),
            pool=self.node,
            device=device,
            vnpu_id=int(spec["vnpuId"]),
            template=str(spec.get("template", "")),
            cdi_ids=(cdi.claim_device_id(claim.uid, device),),
        )

    def _write_specs(self, claim: ClaimId, devices: list[PreparedDevice]) -> None:
        for d in devices:
            cdi.write_claim(
                self.cdi_dir, claim.uid, d.device, d.vnpu_id, d.template, self.host_device_dir
            )
