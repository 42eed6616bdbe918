"""`kubectl vnpu why` for a pod asking `resources.limits: {vnpu.io/<template>: N}`:
on DRA, the scheduler's claim, its devices, their VNPUAllocations and binding
conditions; on the annotation path, the annotated pod plus where its request
came from."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cli_objects import (
    AGENT_NS,
    NOW,
    allocation,
    binding,
    chip,
    dra_allocation,
    dra_claim,
    lease,
    limits_pod,
    node,
    pod,
    vnpunode,
)

from vnpu_cli import why
from vnpu_cli.errors import CliError
from vnpu_cli.main import main, render
from vnpu_cli.snapshot import Snapshot
from vnpu_common.wire import names

GOLDEN = Path(__file__).parent / "golden"
SMALL = "vir05_1c_16g"
CLAIM = "two-vnpu-x7k2p"
DEV0 = names.dra_device_name(0, SMALL, 0)
DEV1 = names.dra_device_name(1, SMALL, 0)


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def cluster(
    *, dra: bool = True, claims: list[dict[str, Any]] | None = None, **extra: Any
) -> Snapshot:
    """node-a: an annotation node; node-d (when `dra`): a DRA node, two chips."""
    vnpunodes = [vnpunode("node-a", chip(0))]
    nodes = [node("node-a")]
    leases = [lease("node-a")]
    if dra:
        vnpunodes.append(vnpunode("node-d", chip(0), chip(1), dra=True))
        nodes.append(node("node-d", labels={"vnpu.io/mode": "dra"}))
        leases.append(lease("node-d"))
    return Snapshot(
        vnpunodes=vnpunodes,
        nodes=nodes,
        leases=leases,
        claims=claims or [],
        agent_namespace=AGENT_NS,
        now=NOW,
        **extra,
    )


def two(**kwargs: Any) -> dict[str, Any]:
    """team-a/two: containers c0 and c1 each ask vnpu.io/vir05_1c_16g: 1."""
    return limits_pod("team-a", "two", {"c0": {SMALL: 1}, "c1": {SMALL: 1}}, **kwargs)


def allocated_claim(
    conditions: dict[str, list[dict[str, str]]] | None = None,
) -> dict[str, Any]:
    return dra_claim(
        "team-a", CLAIM, "two",
        [("container-0-request-0", "node-d", DEV0), ("container-1-request-0", "node-d", DEV1)],
        conditions=conditions,
    )  # fmt: skip


# ------------------------------------------------------------------- DRA


def test_dra_pod_shows_its_claim_devices_and_allocations() -> None:
    claim = allocated_claim(
        {
            DEV0: binding(True, "vNPU of allocation team-a/a0 is ready"),
            DEV1: binding(True, "vNPU of allocation team-a/a1 is ready"),
        }
    )
    allocations = [
        dra_allocation(claim, "container-0-request-0", DEV0, 100),
        dra_allocation(claim, "container-1-request-0", DEV1, 116),
        # Another pod's: not this claim's.
        allocation("team-a", "other", "uid-other", "node-a", 0, 100),
    ]
    running = two(phase="Running", node_name="node-d", claim_name=CLAIM)
    snapshot = cluster(claims=[claim], allocations=allocations)
    report = why.build(running, snapshot)
    assert report["path"] == why.DRA_PATH
    assert report["state"] == why.PLACED
    assert report["routing"] == "served by DRA (the scheduler's claim)"
    assert report["request"]["counts"] == {SMALL: 2}
    assert [(e["container"], e["resource"], e["count"]) for e in report["limits"]] == [
        ("c0", f"vnpu.io/{SMALL}", 1),
        ("c1", f"vnpu.io/{SMALL}", 1),
    ]
    assert report["claim"]["name"] == CLAIM
    assert report["claim"]["source"] == "pod.status.extendedResourceClaimStatus"
    assert [
        (d["container"], d["device"], d["node"], d["chip"], d["vnpuId"], d["phase"], d["binding"])
        for d in report["vnpus"]
    ] == [
        ("c0", DEV0, "node-d", 0, 100, "Ready", "Ready"),
        ("c1", DEV1, "node-d", 1, 116, "Ready", "Ready"),
    ]
    first = names.dra_allocation_name(f"uid-{CLAIM}", DEV0)
    assert report["vnpus"][0]["allocation"] == f"team-a/{first}"
    assert why.text(report) == golden("why_dra_placed.txt")
    # JSON carries the same fields.
    as_json = json.loads(render("why", report, "json"))
    assert as_json["path"] == "dra"
    assert as_json["claim"]["devices"] == as_json["vnpus"] == report["vnpus"]


def test_dra_pod_whose_claim_is_not_made_yet() -> None:
    message = "0/2 nodes are available: 1 cannot allocate all claims, 1 node(s) didn't match"
    waiting = two(unschedulable=message)
    report = why.build(waiting, cluster())
    assert report["state"] == why.WAITING
    assert report["claim"] is None
    assert report["scheduling"]["message"] == message
    assert report["draNodes"] == ["node-d"]
    out = why.text(report)
    assert "kubectl describe pod two -n team-a" in out
    assert out == golden("why_dra_no_claim.txt")
    assert json.loads(render("why", report, "json"))["claim"] is None


def test_dra_device_refused_shows_the_operators_reason() -> None:
    cordoned = (
        "chip 1 of node node-d is cordoned by an admin (fan failing): no new vNPU goes "
        "there, whatever the claim tolerates; uncordon it in spec.cordonedChips of VNPUNode "
        "node-d"
    )
    claim = allocated_claim({DEV0: binding(True, "ready"), DEV1: binding(False, cordoned)})
    allocations = [dra_allocation(claim, "container-0-request-0", DEV0, 100)]
    report = why.build(two(claim_name=CLAIM), cluster(claims=[claim], allocations=allocations))
    assert report["state"] == why.WAITING
    refused = report["vnpus"][1]
    assert (refused["binding"], refused["allocation"]) == ("Failed", None)
    assert refused["bindingMessage"] == cordoned
    assert refused["bindingReason"] == "AllocationFailed"
    out = why.text(report)
    assert f"{DEV1} refused: {cordoned}" in out
    assert out == golden("why_dra_refused.txt")


def test_dra_claim_found_by_owner_before_the_pod_names_it() -> None:
    claim = allocated_claim()
    report = why.build(two(), cluster(claims=[claim]))
    assert report["claim"]["name"] == CLAIM
    assert report["claim"]["source"] == "ownerReferences"
    assert [(d["binding"], d["allocation"]) for d in report["vnpus"]] == [(None, None)] * 2
    assert "vNPUs on their way" in report["summary"]


def test_dra_claim_unreadable_shows_its_allocations() -> None:
    """A 403 on resourceclaims: the claim is named from the pod's status and
    its devices come from the VNPUAllocations that name it."""
    claim = allocated_claim()
    problem = "not allowed to list resourceclaims in team-a: forbidden"
    snapshot = cluster(
        allocations=[dra_allocation(claim, "container-0-request-0", DEV0, 100)],
        claims_problem=problem,
    )
    report = why.build(two(claim_name=CLAIM), snapshot)
    assert report["claim"]["found"] is False
    assert report["claim"]["problem"] == problem
    assert [(d["container"], d["device"], d["vnpuId"]) for d in report["vnpus"]] == [
        ("c0", DEV0, 100)
    ]
    assert problem in why.text(report)


def test_dra_claim_named_but_gone() -> None:
    report = why.build(two(claim_name=CLAIM), cluster())
    assert report["claim"]["found"] is False
    assert "is not there" in report["claim"]["problem"]
    assert report["state"] == why.WAITING


# ------------------------------------------------------- annotation path


def converted(**kwargs: Any) -> dict[str, Any]:
    """team-a/conv asked vnpu.io/vir05_1c_16g: 2 in main's limits; the webhook
    wrote the annotation path's request."""
    annotations = {
        names.ANN_TEMPLATE: SMALL,
        names.ANN_COUNT: "2",
        names.ANN_CONTAINERS: "main",
    }
    return limits_pod("team-a", "conv", {"main": {SMALL: 2}}, annotations=annotations, **kwargs)


def test_annotation_path_pod_converted_from_limits() -> None:
    report = why.build(converted(), cluster(dra=False))
    assert report["path"] == why.ANNOTATION_PATH
    assert report["request"]["template"] == SMALL
    # Every annotated pod carries vnpu.io/<template> in its charge: how it was asked
    # cannot be told afterwards, so it is explained as any annotated pod.
    assert report["limits"] == []
    assert report["routing"] is None
    assert report["fitsOn"] == "node-a"
    assert why.text(report) == golden("why_limits_annotation.txt")


def test_annotated_pod_reads_as_before() -> None:
    report = why.build(pod("team-a", "plain-ann"), cluster(dra=False))
    assert (report["path"], report["limits"], report["routing"]) == ("annotation", [], None)
    assert "Asked as" not in why.text(report)


def test_a_pod_asking_neither_way_is_refused_naming_both() -> None:
    with pytest.raises(CliError, match="team-a/plain does not ask for vNPUs") as exc:
        why.build(pod("team-a", "plain", template=None), cluster())
    assert "vnpu.io/template annotation" in str(exc.value)
    assert "vnpu.io/<template> in its containers' resources.limits" in str(exc.value)


def test_only_a_dra_path_pod_needs_the_claims() -> None:
    assert why.needs_claims(two())
    assert not why.needs_claims(converted())
    assert not why.needs_claims(pod("team-a", "plain", template=None))


# ------------------------------------------- the command, against a server


@pytest.fixture
def fake_cluster(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """An API server answering the pod team-a/two, empty lists, and 403 on
    resourceclaims; yields its kubeconfig and the paths it was asked."""
    asked: list[str] = []
    the_pod = json.dumps(two(claim_name=CLAIM)).encode()

    class Server(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            asked.append(path)
            if path.endswith("/resourceclaims"):
                code, body = (
                    403,
                    json.dumps(
                        {"kind": "Status", "code": 403, "message": "resourceclaims is forbidden"}
                    ).encode(),
                )
            elif path == "/api/v1/namespaces/team-a/pods/two":
                code, body = 200, the_pod
            else:
                code, body = 200, b'{"items": []}'
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{server.server_address[1]}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: team-a}}}}]
current-context: x
"""
    )
    try:
        yield kubeconfig, asked
    finally:
        server.shutdown()


def test_forbidden_claims_are_a_sentence_in_the_report(
    capsys: pytest.CaptureFixture[str], fake_cluster: tuple[Path, list[str]]
) -> None:
    kubeconfig, asked = fake_cluster
    assert main(["why", "two", "--kubeconfig", str(kubeconfig), "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims" in asked
    problem = report["claim"]["problem"]
    assert problem.startswith("not allowed to list resourceclaims in team-a: ")
    assert "resourceclaims is forbidden" in problem
    assert report["claim"]["name"] == CLAIM
