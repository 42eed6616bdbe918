"""The load driver: creates and deletes pods at a steady rate (or as fast as
the client's concurrency allows), watches them for timestamps, and the
floor: a script doing the operator's and agent's API writes with no logic."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from bench.watchloop import StampedWatch
from localplane.pods import vnpu_pod
from vnpu_common.kube.rawcall import call, call_json, describe
from vnpu_common.wire import names
from vnpu_common.wire.patches import JSON_PATCH
from vnpu_operator.lifecycle import containers_stopped

BENCH_UA = "vnpu-bench/1"
FLOOR_UA = "vnpu-floor/1"
FLOOR_GATE = "bench.vnpu.io/floor"
FLOOR_FINALIZER = "bench.vnpu.io/floor"
FLOOR_NODE = "bench-floor"  # no agent serves it: nobody else acts on floor allocations

# (template, count, weight): the churn's mix over 910B3 and 310P3 chips.
MIX: list[tuple[str, int, int]] = [
    ("vir05_1c_16g", 1, 4),
    ("vir05_1c_16g", 2, 2),
    ("vir10_3c_32g", 1, 2),
    ("vir01", 1, 2),
    ("vir02", 2, 1),
    ("vir04", 1, 2),
]
FILL = ("vir10_3c_32g", 4)  # two per node (4 x 910B3, two of these per chip)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def api_client(kubeconfig: Path, user_agent: str, pool: int) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    api = client.ApiClient(cfg)
    api.user_agent = user_agent
    return api


@dataclass
class PodTimes:
    name: str
    template: str
    count: int
    created: float | None = None  # create call returned
    uid: str = ""
    ungated: float | None = None  # first watch event without the gate
    delete_called: float | None = None  # delete call returned
    gone: float | None = None  # DELETED watch event
    node: str = ""
    scheduled: float | None = None  # first watch event with spec.nodeName
    running: float | None = None  # first watch event with status.phase Running
    # The steps bench/steps.py attributes a pod's time to (watch receive times).
    create_sent: float | None = None  # create call sent (admission runs inside it)
    seen: float | None = None  # first watch event (the webhook's gate on it)
    pinned: float | None = None  # first watch event with the visible-devices annotation
    delete_sent: float | None = None  # delete call sent
    terminating: float | None = None  # first watch event with deletionTimestamp
    stopped: float | None = None  # first deleting event whose containers cannot run
    unfinalized: float | None = None  # first deleting event without our pod finalizer

    def ungate_latency(self) -> float | None:
        if self.created is None or self.ungated is None:
            return None
        return max(0.0, self.ungated - self.created)

    def scheduled_latency(self) -> float | None:
        if self.created is None or self.scheduled is None:
            return None
        return max(0.0, self.scheduled - self.created)

    def running_latency(self) -> float | None:
        if self.created is None or self.running is None:
            return None
        return max(0.0, self.running - self.created)

    def gone_latency(self) -> float | None:
        if self.delete_called is None or self.gone is None:
            return None
        return max(0.0, self.gone - self.delete_called)


class Tracker(StampedWatch):
    """Watches the pods of one namespace and stamps ungate and deletion."""

    def __init__(self, core: client.CoreV1Api, namespace: str, gate: str) -> None:
        super().__init__(f"{namespace} pods", partial(core.list_namespaced_pod, namespace))
        self.gate = gate
        self.pods: dict[str, PodTimes] = {}
        self.early_ungated: dict[str, float] = {}
        self.early_gone: dict[str, float] = {}
        self.changed = asyncio.Event()
        self.stop_waiters: dict[str, asyncio.Future[None]] = {}

    def add(self, pod: PodTimes) -> None:
        self.pods[pod.name] = pod
        if pod.name in self.early_ungated:
            pod.ungated = self.early_ungated.pop(pod.name)
        if pod.name in self.early_gone:
            pod.gone = self.early_gone.pop(pod.name)

    def stamp(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        pod = self.pods.get(name)
        if pod is not None:
            steps(pod, obj, now)
        if kind == "DELETED":
            if pod is None:
                self.early_gone[name] = now
            elif pod.gone is None:
                pod.gone = now
        else:
            gates = (obj.get("spec") or {}).get("schedulingGates") or []
            if all(g.get("name") != self.gate for g in gates):
                if pod is None:
                    self.early_ungated.setdefault(name, now)
                elif pod.ungated is None:
                    pod.ungated = now
                    pod.node = str(obj["spec"].get("nodeName") or "")
            if pod is not None:
                if pod.scheduled is None and (obj.get("spec") or {}).get("nodeName"):
                    pod.scheduled = now
                if pod.running is None and (obj.get("status") or {}).get("phase") == "Running":
                    pod.running = now
        if kind == "DELETED" or (pod is not None and pod.stopped is not None):
            waiter = self.stop_waiters.pop(name, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self.changed.set()

    async def stopped(self, pod: PodTimes, timeout: float) -> bool:  # noqa: ASYNC109
        """Whether the watch showed `pod`'s containers stopped (or the pod
        gone) within `timeout` seconds."""
        if pod.stopped is not None or pod.gone is not None:
            return True
        waiter = self.stop_waiters.get(pod.name)
        if waiter is None:
            waiter = self.stop_waiters[pod.name] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            self.stop_waiters.pop(pod.name, None)
            return False
        return True


def steps(pod: PodTimes, obj: dict[str, Any], now: float) -> None:
    """Stamps the steps of the pod's life this event is the first to show."""
    meta = obj.get("metadata") or {}
    if pod.seen is None:
        pod.seen = now
    if pod.pinned is None and names.ANN_VISIBLE_DEVICES in (meta.get("annotations") or {}):
        pod.pinned = now
    if not meta.get("deletionTimestamp"):
        return
    if pod.terminating is None:
        pod.terminating = now
    if pod.stopped is None and containers_stopped(obj):
        pod.stopped = now
    if pod.unfinalized is None and names.POD_FINALIZER not in (meta.get("finalizers") or []):
        pod.unfinalized = now


@dataclass
class Driver:
    """Creates and deletes pods; `floor` does the operator's and agent's
    writes itself (the no-logic floor), else the operator and agent work."""

    core: client.CoreV1Api
    namespace: str
    tracker: Tracker
    limit: asyncio.Semaphore
    floor: FloorWriter | None = None
    plain: bool = False  # baseline: pods that ask for no vNPU
    stop_timeout: float = 120.0  # the floor's longest wait for the kubelet's word
    errors: list[str] = field(default_factory=list)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def manifest(self, name: str, template: str, count: int) -> dict[str, Any]:
        labels = {"app": "vnpu-bench"}
        if self.plain:
            return vnpu_pod(name, self.namespace, template=None, labels=labels)
        if self.floor is None:
            return vnpu_pod(name, self.namespace, template=template, count=count, labels=labels)
        # What the webhook would add, written at creation: no extra write.
        return vnpu_pod(
            name, self.namespace, template=None, labels=labels,
            finalizers=[FLOOR_FINALIZER], scheduling_gates=[FLOOR_GATE],
        )  # fmt: skip

    async def create(self, pod: PodTimes) -> None:
        self.tracker.add(pod)
        body = self.manifest(pod.name, pod.template, pod.count)
        try:
            async with self.limit:
                pod.create_sent = time.monotonic()
                data = await call_json(self.core.create_namespaced_pod, self.namespace, body)
            pod.created = time.monotonic()
            pod.uid = data["metadata"]["uid"]
        except ApiException as exc:
            self.errors.append(f"create {pod.name}: {describe(exc)}")
            return
        if self.floor is not None:
            await self.floor.place(pod, body)

    async def delete(self, pod: PodTimes) -> None:
        try:
            async with self.limit:
                pod.delete_sent = time.monotonic()
                await call(self.core.delete_namespaced_pod, pod.name, self.namespace)
            pod.delete_called = time.monotonic()
        except ApiException as exc:
            self.errors.append(f"delete {pod.name}: {describe(exc)}")
            return
        if self.floor is not None:
            # The operator may release only once the kubelet says no container
            # runs (DECISIONS, "Releasing vNPUs"); a floor that released at the
            # delete would skip a wait every correct release has.
            if not await self.tracker.stopped(pod, self.stop_timeout):
                self.errors.append(
                    f"delete {pod.name}: containers not stopped in {self.stop_timeout:g}s; "
                    "released anyway"
                )
            await self.floor.release(pod)

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


class FloorWriter:
    """Per pod exactly the writes of a placement and a release, no logic:
    create the allocations, set their status, one pod patch (ungate, pin,
    annotate); on delete, once the watch shows the containers stopped (the
    Driver waits, as the operator must): delete the allocations, remove
    their finalizer, remove the pod finalizer."""

    def __init__(self, api: client.ApiClient, namespace: str, nodes: list[str]) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.nodes = nodes
        self.next = 0
        self.errors: list[str] = []

    def _alloc(self, pod: PodTimes, i: int) -> dict[str, Any]:
        return {
            "apiVersion": names.API_VERSION,
            "kind": names.ALLOCATION_KIND,
            "metadata": {
                "name": f"{pod.name}-{i}",
                "namespace": self.namespace,
                "labels": {names.LABEL_NODE: FLOOR_NODE, names.LABEL_POD_UID: pod.uid},
                "finalizers": [names.ALLOCATION_FINALIZER],
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid,
                     "controller": True}
                ],
            },
            "spec": {
                "podName": pod.name, "podUID": pod.uid, "nodeName": FLOOR_NODE,
                "chip": i, "template": pod.template, "vnpuId": 100 + i,
            },
        }  # fmt: skip

    async def _guard(self, what: str, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            await call()
        except ApiException as exc:
            self.errors.append(f"{what}: {describe(exc)}")

    async def place(self, pod: PodTimes, body: dict[str, Any]) -> None:
        g, v, ns, plural = names.GROUP, names.VERSION, self.namespace, names.ALLOCATION_PLURAL
        allocs = [self._alloc(pod, i) for i in range(pod.count)]
        await asyncio.gather(*(
            self._guard("create alloc", partial(
                call, self.custom.create_namespaced_custom_object, g, v, ns, plural, a))
            for a in allocs
        ))  # fmt: skip
        patch_status = self.custom.patch_namespaced_custom_object_status
        status = [{"op": "add", "path": "/status", "value": {
            "phase": names.PHASE_READY,
            "conditions": [{"type": names.COND_READY, "status": "True", "reason": "Created",
                            "message": "vNPU created", "lastTransitionTime": _now()}],
        }}]  # fmt: skip
        await asyncio.gather(*(
            self._guard("patch alloc status", partial(
                call, patch_status, g, v, ns, plural, a["metadata"]["name"], status,
                _content_type=JSON_PATCH))
            for a in allocs
        ))  # fmt: skip
        node = self.nodes[self.next % len(self.nodes)]
        self.next += 1
        devices = ",".join(str(100 + i) for i in range(pod.count))
        ops = [
            {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": FLOOR_GATE}]},
            {"op": "remove", "path": "/spec/schedulingGates"},
            {"op": "add", "path": "/metadata/annotations",
             "value": {names.ANN_VISIBLE_DEVICES: devices}},
            {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In",
                                      "values": [node]}]}]}}}},
        ]  # fmt: skip
        await self._guard(
            "patch pod",
            lambda: call(
                self.core.patch_namespaced_pod, pod.name, ns, ops, _content_type=JSON_PATCH
            ),
        )

    async def release(self, pod: PodTimes) -> None:
        g, v, ns, plural = names.GROUP, names.VERSION, self.namespace, names.ALLOCATION_PLURAL
        allocs = [f"{pod.name}-{i}" for i in range(pod.count)]
        await asyncio.gather(*(
            self._guard("delete alloc", partial(
                call, self.custom.delete_namespaced_custom_object, g, v, ns, plural, a))
            for a in allocs
        ))  # fmt: skip
        patch = self.custom.patch_namespaced_custom_object
        unfin = [{"op": "remove", "path": "/metadata/finalizers"}]
        await asyncio.gather(*(
            self._guard("patch alloc finalizer", partial(
                call, patch, g, v, ns, plural, a, unfin, _content_type=JSON_PATCH))
            for a in allocs
        ))  # fmt: skip
        await self._guard(
            "patch pod finalizer",
            lambda: call(
                self.core.patch_namespaced_pod, pod.name, ns, unfin, _content_type=JSON_PATCH
            ),
        )


def mix_pods(prefix: str, count: int, seed: int = 7) -> list[PodTimes]:
    rng = random.Random(seed)
    weights = [w for _, _, w in MIX]
    out = []
    for i in range(count):
        template, n, _ = rng.choices(MIX, weights=weights)[0]
        out.append(PodTimes(f"{prefix}-{i:05d}", template, n))
    return out


async def churn(
    driver: Driver,
    pods: list[PodTimes],
    rate: float,
    hold: float,
    settle_timeout: float,
    say: Callable[[str], None] | None = None,
) -> float:
    """Creates `pods` at `rate`/s, deletes each `hold` s after its creation,
    waits until every pod the API server accepted is gone; returns the
    phase's duration. A refused create is in `driver.errors`: waiting for
    its pod would hold the phase to the timeout (its CPU window with it)."""
    t0 = time.monotonic()

    async def life(pod: PodTimes, at: float) -> None:
        await driver.create(pod)
        await asyncio.sleep(max(0.0, at + hold - time.monotonic()))
        await driver.delete(pod)

    for i, pod in enumerate(pods):
        at = t0 + i / rate
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        driver.spawn(life(pod, at))
    await driver.drain()
    created = [p for p in pods if p.created is not None]

    def progress() -> None:
        if say is not None:
            gone = sum(1 for p in created if p.gone)
            say(f"churn: {gone} of {len(created)} pods gone, {len(driver.errors)} API errors")

    await wait_until(
        driver.tracker, lambda: all(p.gone for p in created), settle_timeout, progress=progress
    )
    return time.monotonic() - t0


async def wait_until(
    tracker: Tracker,
    cond: Callable[[], bool],
    timeout: float,  # noqa: ASYNC109
    *,
    progress: Callable[[], None] | None = None,
    every: float = 30.0,
) -> bool:
    """True once `cond` holds, False at the timeout; `progress` is called
    every `every` seconds meanwhile (a 1000-node fill takes minutes)."""
    start = time.monotonic()
    deadline = start + timeout
    told = start
    while not cond():
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            return False
        if progress is not None and now - told >= every:
            progress()
            told = now
        tracker.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tracker.changed.wait(), timeout=min(left, 1.0))
    return True


async def burst_create(driver: Driver, pods: list[PodTimes]) -> float:
    """Creates `pods` as fast as the driver's concurrency allows."""
    t0 = time.monotonic()
    for pod in pods:
        driver.spawn(driver.create(pod))
    await driver.drain()
    return t0


async def paced_delete(driver: Driver, pods: list[PodTimes], rate: float) -> float:
    """Deletes `pods`, the i-th sent `i / rate` s after the first (all at
    once when `rate` is 0), and waits for the calls; returns when the first
    was sent."""
    t0 = time.monotonic()
    for i, pod in enumerate(pods):
        if rate:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        driver.spawn(driver.delete(pod))
    await driver.drain()
    return t0


async def delete_all(
    driver: Driver,
    pods: list[PodTimes],
    timeout: float,  # noqa: ASYNC109
    say: Callable[[str], None] | None = None,
) -> bool:
    for pod in pods:
        if pod.delete_called is None and pod.created is not None:
            driver.spawn(driver.delete(pod))
    await driver.drain()
    created = [p for p in pods if p.created]

    def progress() -> None:
        if say is not None:
            say(f"deleting: {sum(1 for p in created if p.gone)} of {len(created)} pods gone")

    return await wait_until(
        driver.tracker, lambda: all(p.gone for p in created), timeout, progress=progress
    )
