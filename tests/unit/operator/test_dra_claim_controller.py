"""The DRA claim controller (vnpu_operator.dra.claims) against the one ledger,
as an attacker and a careless admin would try it (issue 54, items 2 to 6):
ids chosen and booked one device at a time, bookings kept through unknown
outcomes, and devices the chip cannot serve refused at once, whatever the
claim tolerates."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry
from tests.unit.placement.placement_helpers import chip, node

from vnpu_common.kube.apiwrites import FencedWrite
from vnpu_common.wire import names
from vnpu_operator.dra.claims import ClaimController
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.placement import Allocation, Ledger, NodeInventory
from vnpu_operator.podstate import Expectations, Write

SMALL = "vir05_1c_16g"
BIG = "vir10_3c_32g"
DEV0 = names.dra_device_name(0, SMALL, 0)
DEV1 = names.dra_device_name(0, SMALL, 1)
BIG0 = names.dra_device_name(0, BIG, 0)


class FakeApi:
    """OperatorApi's allocation writes; `fail[name]` makes the next create of
    that allocation raise, after (`stored`) or without storing it."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.fail: dict[str, tuple[BaseException, bool]] = {}
        # Run once inside the next create, while it waits for its answer.
        self.meanwhile: Callable[[], Awaitable[None]] | None = None

    async def create_allocation(self, body: dict[str, Any]) -> bool:
        meta = body["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        self.created.append(body)
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            await meanwhile()
        failure = self.fail.pop(key, None)
        if failure is not None:
            exc, stored = failure
            if stored:
                self.stored[key] = body
            raise exc
        self.stored[key] = body
        return True

    async def delete_allocation(self, key: str) -> None:
        self.deleted.append(key)


class FakeClaims:
    """ClaimApi: the claims as the server holds them, and our status writes."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.objects: dict[str, dict[str, Any]] = {}
        self.statuses: list[tuple[str, list[dict[str, Any]]]] = []
        self.allocation_reads: list[str] = []

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(f"{namespace}/{name}")

    async def get_allocation(self, key: str) -> dict[str, Any] | None:
        self.allocation_reads.append(key)
        return self.api.stored.get(key)

    async def set_device_statuses(
        self, namespace: str, name: str, devices: list[dict[str, Any]]
    ) -> None:
        self.statuses.append((f"{namespace}/{name}", [dict(d) for d in devices]))
        claim = self.objects.get(f"{namespace}/{name}")
        if claim is not None:
            claim["status"]["devices"] = devices


def dra(inventory: NodeInventory) -> NodeInventory:
    return replace(inventory, status=inventory.status.model_copy(update={"dra": True}))


def claim(
    name: str, uid: str, *devices: str, pool: str = "n1", tolerate_all: bool = False
) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "npu", "exactly": {"deviceClassName": "vnpu.io"}}
    if tolerate_all:
        # What a tenant writes to pass the published NoSchedule taints.
        request["exactly"]["tolerations"] = [{"operator": "Exists"}]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": [request]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "npu",
                            "driver": names.DRA_DRIVER,
                            "pool": pool,
                            "device": d,
                        }
                        for d in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": f"{uid}-pod"}],
        },
    }


class World:
    def __init__(self, *inventories: NodeInventory) -> None:
        self.ledger = Ledger()
        for inventory in inventories:
            self.ledger.upsert_node(inventory)
        self.api = FakeApi()
        self.claims_api = FakeClaims(self.api)
        self.expect = Expectations()
        self.metrics = OperatorMetrics(CollectorRegistry())
        self.controller = ClaimController(
            self.api,  # type: ignore[arg-type]
            self.claims_api,  # type: ignore[arg-type]
            self.ledger,
            ready=lambda: True,
            retry_max_seconds=1,
            expect=self.expect,
            metrics=self.metrics,
        )
        self.controller.listed = True

    def add(self, obj: dict[str, Any]) -> str:
        self.claims_api.objects[f"ns/{obj['metadata']['name']}"] = obj
        self.controller.claim_event(False, obj)
        return f"ns/{obj['metadata']['name']}"

    async def reconcile(self, key: str) -> None:
        await self.controller.reconcile(key)

    def deliver(self, key: str) -> None:
        """The allocation watch shows the stored object (as the pod controller
        books it and the claim controller reads it)."""
        body = self.api.stored[key]
        self.ledger.add_allocation(Allocation.from_api(body))
        self.controller.allocation_event(False, body)

    def ids(self) -> dict[str, int]:
        return {a.key: a.vnpu_id for a in self.ledger.allocations_on("n1")}

    def refused(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "vnpu_operator_dra_claims_refused_total", {"reason": reason}
        )
        return value or 0.0

    def failure(self, key: str, device: str) -> str | None:
        """The binding-failure message last written for a device, if any."""
        for written_key, devices in reversed(self.claims_api.statuses):
            if written_key != key:
                continue
            for entry in devices:
                if entry["device"] != device:
                    continue
                for c in entry["conditions"]:
                    if c["type"] == names.DRA_COND_FAILED and c["status"] == "True":
                        return str(c["message"])
            return None
        return None


def one_chip(**chip_args: Any) -> NodeInventory:
    return dra(node("n1", [chip("910B3", 0, **chip_args)]))


def timeout() -> TimeoutError:
    return TimeoutError("the create timed out")


def key_of(uid: str, device: str) -> str:
    return f"ns/{names.dra_allocation_name(uid, device)}"


async def test_two_devices_are_booked_one_step_each() -> None:
    """While the first device's create waits for its answer, another claim on
    the node is reconciled: it must not get the id chosen for the second."""
    w = World(one_chip())
    key = w.add(claim("two", "u1", DEV0, DEV1))
    other = w.add(claim("one", "u2", DEV0))

    async def meanwhile() -> None:
        await w.reconcile(other)

    w.api.meanwhile = meanwhile
    await w.reconcile(key)
    by_name = {b["metadata"]["name"]: b["spec"]["vnpuId"] for b in w.api.created}
    ids = [by_name[names.dra_allocation_name("u1", d)] for d in (DEV0, DEV1)]
    assert ids[0] != ids[1], "both devices of one claim got one vNPU id"
    assert by_name[names.dra_allocation_name("u2", DEV0)] not in ids, "two claims got one id"
    assert sorted(w.ids().values()) == sorted(by_name.values())


async def test_a_timed_out_create_keeps_its_booking_so_no_other_claim_gets_the_id() -> None:
    w = World(one_chip())
    first = key_of("u1", DEV0)
    w.api.fail[first] = (timeout(), True)  # stored, but the answer never came
    key = w.add(claim("a", "u1", DEV0))
    with pytest.raises(TimeoutError):
        await w.reconcile(key)
    held = w.ids()
    assert first in held, "a create with an unknown outcome lost its booking"
    assert w.expect.pending(Write.CREATE, first)
    other = w.add(claim("b", "u2", DEV1))
    await w.reconcile(other)
    assert w.ids()[key_of("u2", DEV1)] != held[first]
    # The watch delivers it: the booking is the object's, the create is not repeated.
    w.deliver(first)
    await w.reconcile(key)
    assert not w.expect.pending(Write.CREATE, first)
    assert [b["metadata"]["name"] for b in w.api.created].count(first.split("/")[1]) == 1


async def test_an_unknown_outcome_found_absent_gives_the_booking_back_and_retries() -> None:
    w = World(one_chip())
    first = key_of("u1", DEV0)
    w.api.fail[first] = (ApiException(status=503, reason="Service Unavailable"), False)
    key = w.add(claim("a", "u1", DEV0))
    with pytest.raises(ApiException):
        await w.reconcile(key)
    assert first in w.ids()
    await w.reconcile(key)  # the read says it is absent: created again, booked again
    assert w.claims_api.allocation_reads == [first]
    assert len(w.api.created) == 2
    assert first in w.api.stored
    assert first in w.ids()


async def test_a_definite_refusal_gives_the_booking_back_at_once() -> None:
    w = World(one_chip())
    first = key_of("u1", DEV0)
    w.api.fail[first] = (ApiException(status=403, reason="Forbidden"), False)
    key = w.add(claim("a", "u1", DEV0))
    with pytest.raises(ApiException):
        await w.reconcile(key)
    assert first not in w.ids()
    assert not w.expect.pending(Write.CREATE, first)
    w.api.fail[first] = (FencedWrite(), False)
    with pytest.raises(FencedWrite):
        await w.reconcile(key)
    assert first not in w.ids()


async def test_the_second_devices_failure_leaves_the_first_booked_and_created() -> None:
    w = World(one_chip())
    second = key_of("u1", DEV1)
    w.api.fail[second] = (timeout(), False)
    key = w.add(claim("two", "u1", DEV0, DEV1))
    with pytest.raises(TimeoutError):
        await w.reconcile(key)
    assert key_of("u1", DEV0) in w.api.stored
    assert set(w.ids()) == {key_of("u1", DEV0), second}
    w.deliver(key_of("u1", DEV0))
    await w.reconcile(key)  # the second settled (absent) and created again
    assert set(w.api.stored) == {key_of("u1", DEV0), second}
    ids = w.ids()
    assert ids[key_of("u1", DEV0)] != ids[second]


async def test_an_expired_agent_lease_refuses_the_device_at_once() -> None:
    w = World(replace(one_chip(), live=False))
    key = w.add(claim("a", "u1", DEV0))
    await w.reconcile(key)
    assert w.api.created == []
    message = w.failure(key, DEV0)
    assert message is not None
    assert "not live" in message
    assert "Lease" in message
    assert w.refused("AgentDown") == 1
    w.add(w.claims_api.objects[key])  # the watch shows the status written
    await w.reconcile(key)  # the same refusal, already written: neither written nor counted again
    assert w.refused("AgentDown") == 1
    assert len(w.claims_api.statuses) == 1


async def test_a_pending_allocation_on_a_node_that_stops_being_live_is_given_back() -> None:
    w = World(one_chip())
    key = w.add(claim("a", "u1", DEV0))
    await w.reconcile(key)
    w.deliver(key_of("u1", DEV0))
    w.ledger.set_live("n1", False)
    w.controller.node_lost("n1")
    await w.reconcile(key)
    message = w.failure(key, DEV0)
    assert message is not None
    assert "not live" in message
    assert w.api.deleted == []  # kept until the scheduler deallocates the claim
    assert w.refused("AgentDown") == 1


async def test_a_cordoned_chip_is_refused_whatever_the_claim_tolerates() -> None:
    w = World(replace(one_chip(), cordoned={0: "maintenance"}))
    key = w.add(claim("a", "u1", DEV0, tolerate_all=True))
    await w.reconcile(key)
    assert w.api.created == []
    message = w.failure(key, DEV0)
    assert message is not None
    assert "cordoned" in message
    assert "maintenance" in message
    assert w.refused("Cordoned") == 1


async def test_an_unhealthy_chip_is_refused_whatever_the_claim_tolerates() -> None:
    w = World(one_chip(health="Unhealthy"))
    key = w.add(claim("a", "u1", DEV0, tolerate_all=True))
    await w.reconcile(key)
    assert w.api.created == []
    message = w.failure(key, DEV0)
    assert message is not None
    assert "Unhealthy" in message
    assert w.refused("Unhealthy") == 1


async def test_a_foreign_vnpu_filling_the_chip_refuses_the_device() -> None:
    """The pool describes an empty chip, but a vNPU no allocation declares (a
    foreign one, an orphan, a deferred destroy) holds 10 AICore of 20: the big
    device the scheduler chose cannot fit next to a second one. Refused from
    the ledger, without a create the agent would fail."""
    w = World(one_chip(vnpus=[(100, BIG)]))
    key = w.add(claim("a", "u1", BIG0))
    await w.reconcile(key)  # the first big vNPU fits next to the foreign one
    assert len(w.api.created) == 1
    w.deliver(key_of("u1", BIG0))
    other = w.add(claim("b", "u2", names.dra_device_name(0, BIG, 1)))
    await w.reconcile(other)
    assert len(w.api.created) == 1
    message = w.failure(other, names.dra_device_name(0, BIG, 1))
    assert message is not None
    assert "no room" in message
    assert "no allocation declares" in message
    assert w.refused("NoCapacity") == 1


async def test_a_deleting_claim_keeps_its_allocations() -> None:
    w = World(one_chip())
    key = w.add(claim("a", "u1", DEV0))
    await w.reconcile(key)
    w.deliver(key_of("u1", DEV0))
    deleting = claim("a", "u1", DEV0)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    w.add(deleting)
    await w.reconcile(key)
    assert w.api.deleted == []
    assert key_of("u1", DEV0) in w.ids()
    # Deallocated: now it goes.
    w.add(claim("a", "u1"))
    await w.reconcile(key)
    assert w.api.deleted == [key_of("u1", DEV0)]


async def test_an_admin_access_device_gets_no_vnpu() -> None:
    """With the chart's policies off, or a DeviceClass they do not name, an
    adminAccess result reaches the operator: it would be a vNPU that consumes
    no counter and no quota."""
    w = World(one_chip())
    obj = claim("admin", "u1", DEV0)
    obj["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    key = w.add(obj)
    await w.reconcile(key)
    assert w.api.created == []
    assert w.ids() == {}
    assert "admin access to vNPUs is not supported" in (w.failure(key, DEV0) or "")
    assert w.refused("AdminAccess") == 1


def extended_claim(name: str, uid: str, device_class: str, *devices: str) -> dict[str, Any]:
    """The scheduler's claim for a pod's extended-resource request (KEP-5004),
    in its own shape: annotated, no pod claim name, one request per container
    named container-<i>-request-<j>, owned by the pod it is reserved for."""
    obj = claim(name, uid, *devices)
    obj["metadata"]["annotations"] = {names.DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": f"{name}-pod", "uid": f"{uid}-pod"}
    ]
    request = "container-0-request-0"
    obj["spec"]["devices"]["requests"] = [
        {"name": request, "exactly": {"deviceClassName": device_class, "count": len(devices)}}
    ]
    for result in obj["status"]["allocation"]["devices"]["results"]:
        result["request"] = request
    return obj


async def test_the_schedulers_claim_for_the_catch_all_class_gets_no_vnpu() -> None:
    """KEP-5004's claim for `deviceclass.resource.kubernetes.io/vnpu.io` in a
    pod's limits: no quota on requests.vnpu.io/<template> sees it."""
    w = World(one_chip())
    key = w.add(extended_claim("pod-extended-resources-x", "u1", names.DRA_DEVICE_CLASS, DEV0))
    await w.reconcile(key)
    assert w.api.created == []
    assert "only as vnpu.io/<template>" in (w.failure(key, DEV0) or "")
    assert w.refused("ExtendedResource") == 1


async def test_the_schedulers_claim_for_vnpu_io_template_gets_its_vnpus() -> None:
    """limits: {vnpu.io/vir05_1c_16g: 2}, served through the class
    vir05-1c-16g.vnpu.io: both devices get an allocation, booked in the ledger."""
    w = World(one_chip())
    obj = extended_claim(
        "pod-extended-resources-y", "u2", names.template_device_class(SMALL), DEV0, DEV1
    )
    key = w.add(obj)
    await w.reconcile(key)
    assert sorted(b["spec"]["claim"]["device"] for b in w.api.created) == [DEV0, DEV1]
    assert w.refused("ExtendedResource") == 0
    assert w.failure(key, DEV0) is None


async def test_a_class_of_another_template_is_refused() -> None:
    """A class whose template is not the device's (a class made by hand that
    selects too much) charges quota for one template and hands out another."""
    w = World(one_chip())
    obj = extended_claim("pod-extended-resources-z", "u3", names.template_device_class(BIG), DEV0)
    key = w.add(obj)
    await w.reconcile(key)
    assert w.api.created == []
    assert w.refused("ExtendedResource") == 1


async def test_a_released_allocation_is_deleted_once_before_the_watch_shows_it() -> None:
    """A claim reconciled again before the allocation's deletion reaches the
    watch (its status written, another event) sends no second delete."""
    w = World(one_chip())
    key = w.add(claim("a", "u1", DEV0))
    await w.reconcile(key)
    w.deliver(key_of("u1", DEV0))
    w.add(claim("a", "u1"))  # deallocated
    await w.reconcile(key)
    await w.reconcile(key)
    assert w.api.deleted == [key_of("u1", DEV0)]
