"""A dead agent's pool (vnpu_operator.dra.pools, issue 54 item 6): the leader
deletes the ResourceSlices of a DRA node whose agent Lease expired, so the
scheduler stops choosing it; never those of a node that is live by a fresh
read of its Lease, nor of an annotation node, nor from a standby."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry
from tests.unit.placement.placement_helpers import chip, node

from vnpu_common.wire import names
from vnpu_operator.dra.claims import ClaimController
from vnpu_operator.dra.pools import DeadPools, lease_expiry
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.placement import Ledger, NodeInventory

NOW = 1_800_000_000.0


def stamp(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease(renewed: float, duration: int = 10) -> dict[str, Any]:
    return {"spec": {"renewTime": stamp(renewed), "leaseDurationSeconds": duration}}


class FakePools:
    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.slices: dict[str, list[tuple[str, str]]] = {}
        self.deleted: list[str] = []
        # Slices the agent published again since they were listed.
        self.republished: set[str] = set()

    async def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert namespace == "vnpu-system"
        return self.leases.get(name)

    async def node_slices(self, node: str) -> list[tuple[str, str]]:
        return list(self.slices.get(node, []))

    async def delete_slice(self, name: str, version: str) -> bool:
        if name in self.republished:
            return False
        self.deleted.append(name)
        return True


def dra(inventory: NodeInventory, live: bool = True) -> NodeInventory:
    return replace(inventory, status=inventory.status.model_copy(update={"dra": True}), live=live)


class World:
    def __init__(self, *inventories: NodeInventory) -> None:
        self.ledger = Ledger()
        for inventory in inventories:
            self.ledger.upsert_node(inventory)
        self.api = FakePools()
        self.metrics = OperatorMetrics(CollectorRegistry())
        self.pools = DeadPools(
            self.api,  # type: ignore[arg-type]
            self.ledger,
            agent_namespace="vnpu-system",
            grace_seconds=1,
            retry_max_seconds=1,
            deleted=self.metrics.dra_slices_deleted,
            wall=lambda: NOW,
        )
        for name in ("n1", "n2"):
            self.api.slices[name] = [
                (f"{name}-vnpu-counters-000", "7"),
                (f"{name}-vnpu-devices-000", "8"),
            ]

    def deleted_count(self) -> float:
        value = self.metrics.registry.get_sample_value("vnpu_operator_dra_slices_deleted_total")
        return value or 0.0


def one(name: str, live: bool = True, is_dra: bool = True) -> NodeInventory:
    inventory = node(name, [chip("910B3", 0)], live=live)
    return dra(inventory, live) if is_dra else inventory


async def test_a_dead_dra_nodes_slices_are_deleted_and_counted() -> None:
    w = World(one("n1", live=False), one("n2"))
    w.api.leases[names.lease_name("n1")] = lease(NOW - 30)
    await w.pools.reap("n1")
    assert w.api.deleted == ["n1-vnpu-counters-000", "n1-vnpu-devices-000"]
    assert w.deleted_count() == 2
    await w.pools.reap("n2")  # live: untouched
    assert len(w.api.deleted) == 2


async def test_a_lease_renewed_by_a_fresh_read_keeps_the_pool() -> None:
    """The operator's watch fell behind: the server says the agent renewed."""
    w = World(one("n1", live=False))
    w.api.leases[names.lease_name("n1")] = lease(NOW - 2)
    await w.pools.reap("n1")
    assert w.api.deleted == []


async def test_a_lease_that_is_gone_counts_as_expired() -> None:
    w = World(one("n1", live=False))
    await w.pools.reap("n1")
    assert len(w.api.deleted) == 2


async def test_an_annotation_node_or_a_standby_deletes_nothing() -> None:
    w = World(one("n1", live=False, is_dra=False))
    await w.pools.reap("n1")
    assert w.api.deleted == []
    w2 = World(one("n1", live=False))
    w2.pools.leading = lambda: False
    await w2.pools.reap("n1")
    assert w2.api.deleted == []


async def test_a_slice_the_agent_published_again_is_not_counted() -> None:
    w = World(one("n1", live=False))
    w.api.republished.add("n1-vnpu-devices-000")
    await w.pools.reap("n1")
    assert w.api.deleted == ["n1-vnpu-counters-000"]
    assert w.deleted_count() == 1


async def test_the_claim_controller_reaps_a_lost_node_and_sweeps_on_taking_over() -> None:
    w = World(one("n1"), one("n2", live=False))
    claims = ClaimController(
        None,  # type: ignore[arg-type]  # nothing to reconcile: no claim
        None,  # type: ignore[arg-type]
        w.ledger,
        ready=lambda: True,
        retry_max_seconds=1,
        pools=w.pools,
    )
    claims.claims_listed()  # the sweep finds n2 dead
    await w.pools.queue.idle()
    await w.pools.queue.idle()
    assert sorted(w.api.deleted) == ["n2-vnpu-counters-000", "n2-vnpu-devices-000"]
    w.ledger.set_live("n1", False)
    claims.node_lost("n1")
    await w.pools.queue.idle()
    assert sorted(w.api.deleted)[:2] == ["n1-vnpu-counters-000", "n1-vnpu-devices-000"]
    assert w.deleted_count() == 4


def test_lease_expiry_reads_the_lease_as_the_watch_does() -> None:
    assert lease_expiry(lease(NOW, 10), 1) == NOW + 11
    assert lease_expiry(None, 1) == 0
    assert lease_expiry({"spec": {"renewTime": "garbage", "leaseDurationSeconds": 5}}, 1) == 0
