"""`kubectl vnpu defrag` from plain objects: pods are read as they asked
(the operator's pin taken off), the report and its text, bad flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cli_objects import AGENT_NS, NOW, allocation, chip, lease, node, pod, vnpunode

from vnpu_cli import defrag
from vnpu_cli.errors import CliError
from vnpu_cli.main import _parser, main, render
from vnpu_cli.snapshot import Snapshot
from vnpu_common.wire import names
from vnpu_operator.pinning import HOSTNAME_LABEL, pin_patch, unpinned
from vnpu_operator.placement import Policy
from vnpu_operator.placement import defrag as defrag_plan

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def pinned(raw: dict[str, Any], node_name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The pod after the operator placed it: gated pod + the pinning patch."""
    raw["spec"]["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    out: dict[str, Any] = jsonpatch.apply_patch(raw, pin_patch(raw, node_name, labels, [100]))
    out["spec"]["nodeName"] = node_name
    out["status"]["phase"] = "Running"
    return out


def hostname(name: str) -> dict[str, str]:
    return {HOSTNAME_LABEL: name}


def cluster(pods: list[dict[str, Any]], *, chips: int = 1) -> Snapshot:
    """node-a and node-b, `chips` 910B3 chips each; pod p0 holds a vir05 on
    node-a chip 0, p1 a vir05 on node-b chip 0 (chips=1) or node-a chip 1."""
    second = ("node-b", 0, 100) if chips == 1 else ("node-a", 1, 116)
    a_chips = [chip(0, vnpus=[(100, "vir05_1c_16g")])]
    b_chips = [chip(i) for i in range(chips)]
    if chips == 1:
        b_chips = [chip(0, vnpus=[(100, "vir05_1c_16g")])]
    else:
        a_chips.append(chip(1, vnpus=[(116, "vir05_1c_16g")]))
    return Snapshot(
        vnpunodes=[vnpunode("node-a", *a_chips), vnpunode("node-b", *b_chips)],
        nodes=[
            node("node-a", labels={**hostname("node-a"), "pool": "a"}),
            node("node-b", labels={**hostname("node-b"), "pool": "b"}),
        ],
        leases=[lease("node-a"), lease("node-b")],
        allocations=[
            allocation("team", "p0", "uid-p0", "node-a", 0, 100),
            allocation("team", "p1", "uid-p1", *second),
        ],
        pods=pods,
        agent_namespace=AGENT_NS,
        now=NOW,
    )


def p(name: str, node_name: str, **kwargs: Any) -> dict[str, Any]:
    return pinned(pod("team", name, **kwargs), node_name, hostname(node_name))


def test_scattered_pods_are_gathered_and_the_report_is_stable_json() -> None:
    report = defrag.build(
        cluster([p("p0", "node-a"), p("p1", "node-a")], chips=2),
        policy=Policy.BINPACK,
        max_moves=10,
    )
    assert report["evicted"] == 0
    assert report["largestTemplates"] == {"910B3": "vir10_3c_32g"}
    assert report["largestFits"] == {
        "before": {"910B3": 6},
        "after": {"910B3": 7},
        "limit": {"910B3": 7},
    }
    [step] = report["steps"]
    [moved] = step["pods"]
    assert moved["from"] == {"node": "node-a", "chips": [step["chip"]]}
    assert moved["to"]["node"] == "node-a"
    assert step["chip"] not in moved["to"]["chips"]
    assert step["wholeChips"] == [{"node": "node-a", "chip": step["chip"]}]
    assert report["podsToMove"] == 1
    # JSON round-trips: every value is plain data.
    assert json.loads(render("defrag", report, "json")) == report
    text = render("defrag", report, "text")
    assert defrag.NOTHING_EVICTED in text
    assert "910B3: 6 more x vir10_3c_32g fit now, 7 after the steps below, 7 at most" in text
    assert moved["pod"] in text
    assert "kubectl vnpu cordon NODE CHIP" in text


def test_the_operators_pin_does_not_keep_a_pod_on_its_node() -> None:
    # Each pod pinned to its node by the operator; as asked, either may go
    # to the other node, which frees a whole chip.
    report = defrag.build(
        cluster([p("p0", "node-a"), p("p1", "node-b")]), policy=Policy.BINPACK, max_moves=10
    )
    [step] = report["steps"]
    [moved] = step["pods"]
    assert moved["from"]["node"] != moved["to"]["node"]
    assert report["largestFits"]["after"] == {"910B3": 3}


def test_a_pod_that_asked_for_its_node_is_never_suggested() -> None:
    # p1's own affinity asks for pool b; the operator's pin narrowed it, and
    # only the pin is taken off.
    stay = pod("team", "p1")
    stay["spec"]["affinity"] = {
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}
                ]
            }
        }
    }
    pods = [p("p0", "node-a"), pinned(stay, "node-b", hostname("node-b"))]
    report = defrag.build(cluster(pods), policy=Policy.BINPACK, max_moves=10)
    assert [m["pod"] for s in report["steps"] for m in s["pods"]] == ["team/p0"]
    # And when p0 asks for pool a too, nothing can move.
    pods[0] = p("p0", "node-a", node_selector={"pool": "a"})
    report = defrag.build(cluster(pods), policy=Policy.BINPACK, max_moves=10)
    assert report["steps"] == []
    assert report["largestFits"]["before"] == report["largestFits"]["after"] == {"910B3": 2}
    assert "cannot run elsewhere" in report["summary"]


def test_ending_and_deleted_pods_are_not_moved() -> None:
    done = p("p0", "node-a")
    done["status"]["phase"] = "Succeeded"
    going = p("p1", "node-b")
    going["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    report = defrag.build(cluster([done, going]), policy=Policy.BINPACK, max_moves=10)
    assert report["steps"] == []


def test_a_compact_cluster_says_there_is_nothing_to_gain() -> None:
    snapshot = cluster([p("p0", "node-a"), p("p1", "node-b")])
    snapshot.allocations = snapshot.allocations[:1]
    snapshot.vnpunodes[1] = vnpunode("node-b", chip(0))
    report = defrag.build(snapshot, policy=Policy.SPREAD, max_moves=10)
    assert report["steps"] == []
    assert report["summary"].startswith("Nothing to gain")
    text = defrag.text(report)
    assert "Nothing to gain" in text
    assert "STEP" not in text


def test_an_unknown_node_is_an_error() -> None:
    with pytest.raises(CliError, match='VNPUNode "nope" not found'):
        defrag.build(cluster([]), policy=Policy.BINPACK, max_moves=10, node="nope")


def test_bad_flags_exit_2_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    for flags, said in (
        (["--max-moves", "0"], "--max-moves: must be at least 1, not 0"),
        (["--max-moves", "ten"], "--max-moves: 'ten' is not a whole number"),
        (["--policy", "tetris"], "--policy: invalid choice: 'tetris'"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["defrag", *flags])
        assert exited.value.code == 2
        assert said in capsys.readouterr().err
    args = _parser().parse_args(["defrag", "-o", "json", "--node", "n", "--max-moves", "3"])
    assert (args.output, args.node, args.max_moves, args.policy) == ("json", "n", 3, "binpack")


def test_no_kubeconfig_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    assert main(["defrag", "--kubeconfig", str(missing)]) == 1
    assert f"error: no kubeconfig at {missing}" in capsys.readouterr().err


def test_a_search_cut_short_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defrag_plan, "MAX_TRIALS", 1)
    monkeypatch.setattr(defrag, "MAX_TRIALS", 1)
    # Both pods pinned: every trial fails, the first try ends the search.
    pods = [p("p0", "node-a", node_selector={"pool": "a"}), p("p1", "node-b")]
    pods[1]["spec"]["nodeSelector"] = {"pool": "b"}
    report = defrag.build(cluster(pods), policy=Policy.BINPACK, max_moves=10)
    assert (report["chipsTried"], report["chipsConsidered"]) == (1, 2)
    assert "stopped after trying 1 of 2 chips" in report["summary"]


def test_help_says_it_evicts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["defrag", "--help"])
    assert "nothing is evicted" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------ unpinned


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"affinity": {"podAntiAffinity": {}}},
        {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
        {
            "affinity": {
                "nodeAffinity": {
                    REQUIRED: {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In",
                                                   "values": ["b"]}]},
                            {"matchFields": [{"key": "metadata.name", "operator": "In",
                                              "values": ["x"]}]},
                        ]
                    }
                }
            }
        },
    ],
    ids=["no-affinity", "other-affinity", "preferred-only", "own-terms"],
)  # fmt: skip
def test_unpinned_gives_back_what_the_pod_asked(spec: dict[str, Any]) -> None:
    raw = pod("team", "p")
    raw["spec"].update(json.loads(json.dumps(spec)))
    asked = json.loads(json.dumps(raw["spec"]))
    after = pinned(raw, "node-b", hostname("node-b"))
    assert after["spec"].get("affinity") != asked.get("affinity")  # the pin is there
    back = unpinned(after, "node-b", hostname("node-b"))
    assert back["spec"].get("affinity") == asked.get("affinity")
    assert after["spec"].get("affinity") != asked.get("affinity")  # input left alone


def test_unpinned_leaves_alone_what_the_operator_did_not_write() -> None:
    gated = pod("team", "p")
    gated["spec"]["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    gated["spec"]["affinity"] = {
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    # Gated: never pinned, so the exact-node term is the pod's own.
    assert unpinned(gated, "a", hostname("a")) == gated
    # A pin to another node than the allocation's is not ours either.
    running = dict(gated, spec={k: v for k, v in gated["spec"].items() if k != "schedulingGates"})
    assert unpinned(running, "b", hostname("b")) == running
