"""`kubectl vnpu status` shows each node's fragmentation and the cluster's:
the figures Ledger.fragmentation computes over the same objects."""

from __future__ import annotations

from cli_objects import AGENT_NS, NOW, chip, lease, node, vnpunode

from vnpu_cli import status
from vnpu_cli.snapshot import Snapshot

VIR05 = "vir05_1c_16g"


def scattered() -> Snapshot:
    """frag: two 910B3 chips with one orphan vir05 each, 15 AICore free on
    each: one vir10_3c_32g fits per chip (2), three would gathered.
    whole: an empty 910B3 chip takes both of its two."""
    return Snapshot(
        vnpunodes=[
            vnpunode("frag", chip(0, vnpus=[(100, VIR05)]), chip(1, vnpus=[(116, VIR05)])),
            vnpunode("whole", chip(0)),
        ],
        nodes=[node("frag"), node("whole")],
        leases=[lease("frag"), lease("whole")],
        agent_namespace=AGENT_NS,
        now=NOW,
    )


def test_report_carries_the_figures_per_node_and_for_the_cluster() -> None:
    report = status.build(scattered())
    by_name = {n["name"]: n["fragmentation"] for n in report["nodes"]}
    assert by_name["frag"] == {
        "freeAICore": 30,
        "largestTemplateAICore": 20,
        "largestTemplateFits": 2,
        "largestTemplateFitsGathered": 3,
        "ratio": 0.33,
    }
    assert by_name["whole"]["largestTemplateFits"] == 2
    assert by_name["whole"]["ratio"] == 0
    assert report["largestTemplates"] == {"910B3": "vir10_3c_32g"}
    assert report["cluster"]["fragmentation"]["largestTemplateFits"] == 4
    assert report["cluster"]["fragmentation"]["ratio"] == 0.2


def test_text_has_a_fragmentation_row_per_node_and_a_cluster_line_within_80_columns() -> None:
    text = status.text(status.build(scattered()))
    lines = text.splitlines()
    header = ["NODE", "FREE-AICORE", "LARGEST-FITS", "GATHERED", "FRAGMENTATION"]
    start = next(i for i, line in enumerate(lines) if line.split() == header)
    assert lines[start + 1].split() == ["frag", "30", "2", "3", "0.33"]
    assert lines[start + 2].split() == ["whole", "20", "2", "2", "0.00"]
    assert lines[start + 3] == "largest templates: 910B3 vir10_3c_32g"
    assert lines[start + 4] == "cluster: 4 more fit, 5 gathered on whole chips: fragmentation 0.20"
    assert all(len(line) <= 80 for line in lines[start : start + 5])


def test_no_template_offered_says_so() -> None:
    snapshot = Snapshot(
        vnpunodes=[vnpunode("bare")], nodes=[node("bare")], leases=[lease("bare")],
        agent_namespace=AGENT_NS, now=NOW,
    )  # fmt: skip
    text = status.text(status.build(snapshot))
    assert "largest templates: none offered" in text
    assert "cluster: 0 more fit, 0 gathered on whole chips: fragmentation 0.00" in text
