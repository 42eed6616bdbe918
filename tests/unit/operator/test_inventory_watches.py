"""The operator's informers of VNPUNodes and Nodes feed the inventories the
ledger books against, and the controller is synced only once every kind has
listed. The informer is fed canned list answers here; tests/integration
runs the same informers against the real API server."""

from __future__ import annotations

from typing import Any, cast

from test_controller import World, lease, node_obj, vnpu_node
from test_convergence import Answer

from vnpu_common.kube.informer import Informer
from vnpu_operator.config import OperatorSettings
from vnpu_operator.controller import SOURCES
from vnpu_operator.watches import node_informer, vnpunode_informer


class Lister:
    """A list call answering with `items` (one page)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.version = 1

    async def __call__(self, *_: Any, **kwargs: Any) -> Answer:
        assert not kwargs.get("watch"), "only lists are answered here"
        self.version += 1
        meta = {"resourceVersion": str(self.version)}
        return Answer(200, {"metadata": meta, "items": self.items})


def with_uid(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    obj["metadata"]["uid"] = uid
    return obj


def informers(w: World) -> tuple[Informer, Lister, Informer, Lister]:
    settings = OperatorSettings()
    inventories = w.controller.inventories
    vnpunodes = vnpunode_informer(cast(Any, None), w.controller, inventories, settings)
    nodes = node_informer(cast(Any, None), w.controller, inventories, settings)
    vnpunode_list, node_list = Lister(), Lister()
    vnpunodes._list_call, nodes._list_call = vnpunode_list, node_list
    return vnpunodes, vnpunode_list, nodes, node_list


async def test_listed_inventories_reach_the_ledger_and_sync_waits_for_every_kind() -> None:
    w = World()
    c = w.controller
    for name in ("n1", "n2"):
        c.inventories.leases.lease_event(None, lease(name, w.now))
    vnpunodes, vnpunode_list, nodes, node_list = informers(w)
    vnpunode_list.items = [
        with_uid(vnpu_node("n1"), "v1"),
        with_uid(vnpu_node("n2", chips=2), "v2"),
    ]
    node_list.items = [with_uid(node_obj("n1", zone="a"), "k1"), with_uid(node_obj("n2"), "k2")]

    await vnpunodes._list()
    await nodes._list()
    assert sorted(c.ledger.node_names()) == ["n1", "n2"]
    assert c.inventories.labels("n1")["zone"] == "a"
    assert all(c.inventories.live().values())
    # The inventory kinds alone do not make the caches complete.
    assert not c.synced
    for source in SOURCES:
        c.listed(source)
    assert c.synced


async def test_a_deleted_vnpunode_and_node_leave_the_inventories() -> None:
    w = World()
    c = w.controller
    c.inventories.leases.lease_event(None, lease("n1", w.now))
    vnpunodes, vnpunode_list, nodes, node_list = informers(w)
    vnpunode_list.items = [with_uid(vnpu_node("n1"), "v1")]
    node_list.items = [with_uid(node_obj("n1"), "k1")]
    await vnpunodes._list()
    await nodes._list()
    assert c.inventories.live() == {"n1": True}

    # A watch event for the Node: the node is not live without it.
    await nodes._event({"type": "DELETED", "object": with_uid(node_obj("n1"), "k1")})
    assert c.inventories.live() == {"n1": False}
    # A VNPUNode gone while the watch was down: the re-list reports it by
    # the identity the informer kept, and the ledger forgets the node.
    vnpunode_list.items = []
    await vnpunodes._list()
    assert c.ledger.node_names() == []
    assert c.inventories.vnpunodes == {}


async def test_a_status_heartbeat_of_a_node_changes_nothing_placement_reads() -> None:
    w = World()
    c = w.controller
    c.inventories.leases.lease_event(None, lease("n1", w.now))
    refreshed: list[str] = []
    c.inventories.refreshed = refreshed.append
    _, _, nodes, node_list = informers(w)
    node_list.items = [with_uid(node_obj("n1"), "k1")]
    await nodes._list()
    assert refreshed == ["n1"]
    beat = with_uid(node_obj("n1"), "k1")
    beat["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    await nodes._event({"type": "MODIFIED", "object": beat})
    assert refreshed == ["n1"]
    labelled = with_uid(node_obj("n1", zone="b"), "k1")
    await nodes._event({"type": "MODIFIED", "object": labelled})
    assert refreshed == ["n1", "n1"]
    assert c.inventories.labels("n1")["zone"] == "b"
