"""The plugin's reports from plain objects: what `status`, `why` and `usage`
compute, and how their tables and JSON read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_objects import AGENT_NS, NOW, allocation, chip, lease, node, pod, vnpunode

from vnpu_cli import status, usage, why
from vnpu_cli.errors import CliError
from vnpu_cli.main import render
from vnpu_cli.snapshot import Snapshot
from vnpu_operator.placement import Ledger, NodeInventory, NoFit, PodRequest

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> str:
    """Expected output, kept as a file: tables are wider than a source line."""
    return (GOLDEN / name).read_text()


def cluster(pods: list[dict[str, Any]] | None = None) -> Snapshot:
    """node-a: one 910B3 chip full with team-a/big's two vir10_3c_32g.
    node-b: chip 0 holds team-b/small's vir05; chip 1 an orphan vir05 (no
    allocation) and team-b/new's vir05 its agent has not made yet.
    node-c: its agent's Lease ran out."""
    return Snapshot(
        vnpunodes=[
            vnpunode("node-a", chip(0, vnpus=[(100, "vir10_3c_32g"), (101, "vir10_3c_32g")])),
            vnpunode(
                "node-b",
                chip(0, vnpus=[(100, "vir05_1c_16g")]),
                chip(1, vnpus=[(116, "vir05_1c_16g")]),
            ),
            vnpunode("node-c", chip(0, health="Unhealthy")),
        ],
        nodes=[node("node-a"), node("node-b", labels={"pool": "b"}), node("node-c")],
        leases=[lease("node-a"), lease("node-b"), lease("node-c", renewed_ago=100)],
        allocations=[
            allocation("team-a", "big", "uid-big", "node-a", 0, 100, "vir10_3c_32g", index=0),
            allocation("team-a", "big", "uid-big", "node-a", 0, 101, "vir10_3c_32g", index=1),
            allocation("team-b", "small", "uid-small", "node-b", 0, 100),
            allocation("team-b", "new", "uid-new", "node-b", 1, 117, phase=None),
        ],
        pods=pods or [],
        agent_namespace=AGENT_NS,
        now=NOW,
    )


# ------------------------------------------------------------------ status


def test_status_counts_what_placement_counts() -> None:
    report = status.build(cluster())
    by_name = {n["name"]: n for n in report["nodes"]}
    assert [n["name"] for n in report["nodes"]] == ["node-a", "node-b", "node-c"]
    assert [n["live"] for n in report["nodes"]] == [True, True, False]
    (full,) = by_name["node-a"]["chips"]
    assert full["aicore"] == {"used": 20, "free": 0, "total": 20}
    assert full["memoryMB"] == {"used": 65536, "free": 0, "total": 65536}
    assert full["aicpu"] == {"used": 6, "free": 1, "total": 7}
    # Orphan and not-yet-created vNPU both hold chip 1's capacity.
    chip1 = by_name["node-b"]["chips"][1]
    assert chip1["aicore"] == {"used": 10, "free": 10, "total": 20}
    assert [(v["id"], v["phase"], v["pod"], v["created"]) for v in chip1["vnpus"]] == [
        (116, "orphan", None, True),
        (117, "Pending", "team-b/new", False),
    ]
    # The ledger, fed the same objects, agrees chip by chip.
    snapshot = cluster()
    for cap in snapshot.ledger().capacity():
        shown = next(c for c in by_name[cap.node]["chips"] if c["index"] == cap.chip)
        assert shown["aicore"] == {
            "used": cap.used.aicore,
            "free": cap.free.aicore,
            "total": cap.total.aicore,
        }
    assert all(c["cordon"] is None for n in report["nodes"] for c in n["chips"])


def test_a_vnpu_listed_as_a_gone_allocations_is_released_and_holds_nothing() -> None:
    """The agent writes the VNPUNode at leisure after a release (it restates the
    deletion): until then the chip lists the destroyed vNPU under its allocation's
    name. It holds no capacity, as for the operator; a vNPU listed as nobody's still
    does (an orphan), and so does one whose allocation stands."""
    snapshot = cluster()
    node_b = snapshot.vnpunodes[1]
    vnpus = node_b["status"]["chips"][1]["vnpus"]
    vnpus.append({"id": 118, "template": "vir05_1c_16g", "inUse": False,
                  "allocation": "team-b/gone", "podUID": "uid-gone"})  # fmt: skip
    report = status.build(snapshot)
    chip1 = next(n for n in report["nodes"] if n["name"] == "node-b")["chips"][1]
    assert [(v["id"], v["phase"], v["allocation"], v["created"]) for v in chip1["vnpus"]] == [
        (116, "orphan", None, True),
        (117, "Pending", "team-b/new-0", False),
        (118, "released", "team-b/gone", False),
    ]
    # The same as without it: the orphan and the Pending vNPU, 5 AICore each.
    assert chip1["aicore"] == {"used": 10, "free": 10, "total": 20}
    # Named as a standing allocation's, it counts once, through the allocation.
    node_b["status"]["chips"][0]["vnpus"][0]["allocation"] = "team-b/small-0"
    chip0 = next(n for n in status.build(snapshot)["nodes"] if n["name"] == "node-b")["chips"][0]
    assert chip0["aicore"]["used"] == 5
    assert [(v["id"], v["phase"]) for v in chip0["vnpus"]] == [(100, "Ready")]


STATUS_TEXT = golden("status.txt")


def test_status_text() -> None:
    assert render("status", status.build(cluster()), "text") == STATUS_TEXT


def test_status_with_no_vnpunodes_says_so() -> None:
    assert status.text(status.build(Snapshot(now=NOW))) == (
        "No VNPUNodes found: no node runs the vnpu agent.\n"
    )


def test_json_is_the_report() -> None:
    report = status.build(cluster())
    assert json.loads(render("status", report, "json")) == report


def test_cordon_column_shows_what_the_vnpunode_declares() -> None:
    """spec.cordonedChips names a chip and why: the column shows the reason,
    '-' for every other chip and for VNPUNodes without the field."""
    snapshot = cluster()
    snapshot.vnpunodes[1]["spec"] = {"cordonedChips": [{"chip": 1, "reason": "fan failing"}]}
    report = status.build(snapshot)
    cordons = {(n["name"], c["index"]): c["cordon"] for n in report["nodes"] for c in n["chips"]}
    assert cordons == {
        ("node-a", 0): None,
        ("node-b", 0): None,
        ("node-b", 1): "fan failing",
        ("node-c", 0): None,
    }
    assert "fan failing" in status.text(report)


# --------------------------------------------------------------------- why


def test_why_waiting_gives_the_ledgers_reasons_per_node() -> None:
    waiting = pod(
        "team-a", "wait", template="vir10_3c_32g", count=3,
        condition=("False", "WaitingForCapacity", "0/3 nodes can host 3 x vir10_3c_32g"),
    )  # fmt: skip
    snapshot = cluster()
    report = why.build(waiting, snapshot)
    assert report["state"] == why.WAITING
    expected = snapshot.ledger().place(PodRequest.from_pod(waiting))
    assert isinstance(expected, NoFit)
    assert report["summary"] == expected.message
    assert {n["node"]: n["reason"] for n in report["nodes"]} == {
        k: str(v) for k, v in expected.node_reasons.items()
    }
    assert {n["node"]: n["reason"] for n in report["nodes"]} == {
        "node-a": "insufficient-aicore",
        "node-b": "insufficient-aicore",
        "node-c": "node-not-live",
    }
    chips_a = report["nodes"][0]["chips"]
    assert chips_a == [
        {
            "chip": 0,
            "model": "910B3",
            "reason": "insufficient-aicore",
            "message": "insufficient AICore",
            "free": {"aicore": 0, "memoryMB": 0, "aicpu": 1},
            "needs": {"aicore": 10, "memoryMB": 32768, "aicpu": 3},
        }
    ]


WHY_WAITING_TEXT = golden("why_waiting.txt")


def test_why_waiting_text() -> None:
    message = "0/3 nodes can host 3 x vir10_3c_32g: 2 insufficient AICore, 1 node agent not live"
    waiting = pod(
        "team-a", "wait", template="vir10_3c_32g", count=3,
        condition=("False", "WaitingForCapacity", message),
    )  # fmt: skip
    assert render("why", why.build(waiting, cluster()), "text") == WHY_WAITING_TEXT


def test_why_names_a_node_selector_and_a_node_with_room() -> None:
    waiting = pod("team-a", "sel", node_selector={"pool": "b"})
    report = why.build(waiting, cluster())
    assert report["fitsOn"] == "node-b"
    assert "Node node-b has room now" in why.text(report)
    picky = pod("team-a", "sel", template="vir10_3c_32g", count=2, node_selector={"pool": "x"})
    reasons = {n["node"]: n["reason"] for n in why.build(picky, cluster())["nodes"]}
    assert reasons == {
        "node-a": "node-selector",
        "node-b": "node-selector",
        "node-c": "node-not-live",
    }


WHY_PLACED_TEXT = golden("why_placed.txt")


def test_why_placed_lists_where_the_vnpus_are() -> None:
    placed = pod(
        "team-a", "big", template="vir10_3c_32g", count=2, phase="Running", node_name="node-a",
        condition=("True", "Allocated", "2 x vir10_3c_32g on node-a"),
    )  # fmt: skip
    report = why.build(placed, cluster())
    assert report["state"] == why.PLACED
    assert [(v["node"], v["chip"], v["vnpuId"]) for v in report["vnpus"]] == [
        ("node-a", 0, 100),
        ("node-a", 0, 101),
    ]
    assert why.text(report) == WHY_PLACED_TEXT


def test_why_refuses_a_pod_that_does_not_ask_for_vnpus() -> None:
    with pytest.raises(CliError, match="team-a/plain does not ask for vNPUs"):
        why.build(pod("team-a", "plain", template=None), cluster())


def test_why_reports_a_malformed_request() -> None:
    report = why.build(pod("team-a", "bad", template="not-a-template"), cluster())
    assert report["state"] == why.WAITING
    assert "vnpu.io/template" in report["problem"]
    assert "cannot be placed as written" in why.text(report)


def test_why_for_an_ended_pod() -> None:
    report = why.build(pod("team-a", "done", phase="Succeeded"), cluster())
    assert report["state"] == why.FINISHED
    assert "holds no vNPUs" in why.text(report)


def test_why_does_not_change_what_it_reads() -> None:
    snapshot = cluster()
    before = json.dumps(snapshot.allocations, sort_keys=True)
    why.build(pod("team-a", "sel", node_selector={"pool": "b"}), snapshot)
    assert json.dumps(snapshot.allocations, sort_keys=True) == before
    assert len(snapshot.ledger().allocations()) == 4


# ------------------------------------------------------------------- usage


def test_usage_sums_templates_per_namespace() -> None:
    pods = [
        pod("team-a", "big", phase="Running"),
        pod("team-a", "wait", template="vir10_3c_32g"),
        pod("team-b", "gone", phase="Failed"),
        pod("team-c", "queued"),
    ]
    report = usage.build(cluster(pods))
    rows = {r["namespace"]: r for r in report["namespaces"]}
    assert rows["team-a"] == {
        "namespace": "team-a", "pods": 1, "vnpus": 2, "aicore": 20, "memoryMB": 65536,
        "unsized": 0, "waiting": 1, "quota": None,
    }  # fmt: skip
    assert (rows["team-b"]["pods"], rows["team-b"]["vnpus"], rows["team-b"]["aicore"]) == (2, 2, 10)
    assert rows["team-b"]["waiting"] == 0  # its Failed pod waits for nothing
    assert (rows["team-c"]["vnpus"], rows["team-c"]["waiting"]) == (0, 1)
    only_b = usage.build(cluster(pods), "team-b")
    assert [r["namespace"] for r in only_b["namespaces"]] == ["team-b"]


USAGE_TEXT = golden("usage.txt")


def _quota(namespace: str, name: str, hard: dict[str, str], used: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"hard": hard},
        "status": {"hard": hard, "used": used},
    }


def test_usage_shows_the_tightest_quota_used_over_hard() -> None:
    snapshot = cluster()
    snapshot.quotas = [
        _quota("team-a", "wide", {"requests.vnpu.io/vnpus": "10"}, {"requests.vnpu.io/vnpus": "3"}),
        _quota("team-a", "tight", {"requests.vnpu.io/vnpus": "4", "requests.vnpu.io/aicore": "30",
                                   "requests.cpu": "8"},
               {"requests.vnpu.io/vnpus": "3", "requests.vnpu.io/aicore": "25"}),
        _quota("team-d", "idle", {"requests.vnpu.io/memory-mb": "64Ki"}, {}),
    ]  # fmt: skip
    rows = {r["namespace"]: r for r in usage.build(snapshot)["namespaces"]}
    assert rows["team-a"]["quota"] == {
        "vnpu.io/vnpus": {"hard": 4, "used": 3, "quota": "tight"},
        "vnpu.io/aicore": {"hard": 30, "used": 25, "quota": "tight"},
    }
    # A namespace capped but using nothing has its row too.
    assert rows["team-d"]["quota"] == {
        "vnpu.io/memory-mb": {"hard": 65536, "used": 0, "quota": "idle"}
    }
    lines = {
        line.split()[0]: line.split() for line in usage.text(usage.build(snapshot)).splitlines()
    }
    assert lines["team-a"][-3:] == ["3/4", "25/30", "-"]
    assert lines["team-d"][-3:] == ["-", "-", "0/65536"]
    assert [r["namespace"] for r in usage.build(snapshot, "team-d")["namespaces"]] == ["team-d"]


def test_usage_text_shows_quota_as_unset() -> None:
    assert render("usage", usage.build(cluster()), "text") == USAGE_TEXT
    assert (
        usage.text(usage.build(Snapshot(now=NOW))) == "No vNPUs in use and no vNPU pod waiting.\n"
    )


def test_usage_agrees_with_the_ledger() -> None:
    """Sum of every namespace's AICore == sum of the ledger's used AICore minus orphans."""
    snapshot = cluster()
    total = sum(r["aicore"] for r in usage.build(snapshot)["namespaces"])
    ledger: Ledger = snapshot.ledger()
    orphan_aicore = 5  # node-b chip 1's orphan vir05_1c_16g
    assert total == sum(c.used.aicore for c in ledger.capacity()) - orphan_aicore


def test_inventory_of_a_node_without_node_object_is_not_live() -> None:
    snapshot = cluster()
    snapshot.nodes = [n for n in snapshot.nodes if n["metadata"]["name"] != "node-a"]
    live: dict[str, NodeInventory] = {i.name: i for i in snapshot.inventories()}
    assert live["node-a"].live is False
