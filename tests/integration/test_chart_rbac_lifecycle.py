"""The chart's RBAC is enough for the real components: the chart installed into the agents'
namespace, the real operator running with the operator ServiceAccount's token and one real
agent per node with a token bound to that Node (so the node-scoping admission policy
applies), never the admin certificate. A pod's whole vNPU lifecycle must work and neither
component may log a single 403/Forbidden. Last, the documented uninstall order leaves no pod
stuck on its finalizer and no webhook configuration behind.

The tests of this module share one release and run in file order: uninstall last.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, RELEASE, adopt_crds, helm
from operator_harness import (
    audit_since,
    delete_vnpu_pods,
    get_json,
    pod_allocations,
    pod_gone,
    pod_running,
    purge_foreign,
)

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess, vnpu_ids
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

# The chart's Lease Role lives in the release namespace: the agents' namespace.
NAMESPACE = AGENT_NAMESPACE
OPERATOR_SA = f"{RELEASE}-operator"
AGENT_SA = f"{RELEASE}-agent"
NODES = ("rb-a", "rb-b")
# The release's allocations: those of its nodes. Other modules' leftovers on nodes
# no agent serves any more are not what the uninstall order is about.
OURS = f"{names.LABEL_NODE} in ({','.join(NODES)})"
TEMPLATE = "vir05_1c_16g"
LARGE = "vir10_3c_32g"  # 2 per 910B3 chip: 4 per node at most
WEBHOOK_KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")

# Log lines start with the asctime of the logging format ("... 12:00:01,403 "), whose
# milliseconds must not count as a status code.
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
DENIED = re.compile(r"\b403\b|forbidden", re.IGNORECASE)


def installed(plane: LocalPlane) -> bool:
    return helm(plane, "status", RELEASE, "-n", NAMESPACE, check=False).returncode == 0


def token_kubeconfig(plane: LocalPlane, path: Path, sa: str, *bound: str) -> Path:
    """A kubeconfig with a bearer token of `sa` in the release namespace."""
    return plane.token_kubeconfig(path, sa, NAMESPACE, *bound)


def whoami(plane: LocalPlane, kubeconfig: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [plane.binary("kubectl"), f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in plane.env().items() if k != "KUBECONFIG"},
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout)["status"]["userInfo"])


def denials(log: Path) -> list[str]:
    """Lines of a component's log that tell of a forbidden request."""
    if not log.exists():
        return []
    return [
        line
        for line in log.read_text(errors="replace").splitlines()
        if DENIED.search(TIMESTAMP.sub("", line))
    ]


@dataclass
class Release:
    operator: OperatorProcess
    agents: dict[str, AgentProcess]
    audit_offset: int

    def logs(self) -> list[Path]:
        return [self.operator.log_path, *(a.log_path for a in self.agents.values())]

    def denials(self) -> dict[str, list[str]]:
        return {str(p): found for p in self.logs() if (found := denials(p))}

    def stop(self) -> None:
        self.operator.kill(signal.SIGTERM)
        for agent in self.agents.values():
            agent.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def release(plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    workdir = Path(tmp_path_factory.mktemp("chart-rbac"))
    if plane.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        plane.kubectl("create", "namespace", NAMESPACE)
    adopt_crds(plane, NAMESPACE)
    # The release brings the protection policies for its own operator ServiceAccount.
    plane.remove_policies()
    helm(plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--set", "agent.driver=sim")
    rel: Release | None = None
    try:
        plane.add_nodes([NodeSpec(name=n, chips={"910B3": 2}) for n in NODES])
        purge_foreign(plane, NODES)
        op_kubeconfig = token_kubeconfig(plane, workdir / "operator.kubeconfig", OPERATOR_SA)
        # As the chart runs it with DRA off (VNPU_DRA=false): no claim informer,
        # whose watch its RBAC, without resource.k8s.io rules then, would refuse.
        operator = OperatorProcess(
            plane, workdir / "operator", extra=["--dra=false", f"--kubeconfig={op_kubeconfig}"]
        )
        agents: dict[str, AgentProcess] = {}
        for node in NODES:
            (workdir / f"agent-{node}").mkdir()
            kubeconfig = token_kubeconfig(
                plane,
                workdir / f"agent-{node}.kubeconfig",
                AGENT_SA,
                "--bound-object-kind=Node",
                f"--bound-object-name={node}",
            )
            agents[node] = AgentProcess(
                plane, workdir / f"agent-{node}", [node], extra=[f"--kubeconfig={kubeconfig}"]
            )
        rel = Release(operator, agents, plane.audit_log.stat().st_size)
        for agent in agents.values():
            agent.start()
        wait_for(
            "VNPUNodes published",
            lambda: all(get_json(plane, "vnpunode", n) for n in NODES),
            timeout=60,
        )
        operator.start()
        yield rel
    finally:
        try:
            alive = rel is not None and all(
                p.proc is not None for p in (rel.operator, *rel.agents.values())
            )
            if alive:
                # A failed test may leave vNPU pods: released while both components run.
                delete_vnpu_pods(plane, timeout=90)
        finally:
            if rel is not None:
                rel.stop()
            if installed(plane):
                helm(
                    plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s",
                    check=False,
                )  # fmt: skip
            # Later modules create vNPU pods without an operator: no webhook may be left.
            for kind in WEBHOOK_KINDS:
                plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)
            plane.install_policies()
            for node in NODES:
                plane.kubectl("delete", "node", node, "--wait=false", check=False)
                plane.kubectl("delete", "vnpunode", node, "--wait=false", check=False)
                plane.kubectl(
                    "delete", "lease", "-n", NAMESPACE, names.lease_name(node), "--wait=false",
                    check=False,
                )  # fmt: skip


def running(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any]:
    return pod_running(plane, namespace, name, timeout=120, interval=0.5)


def gone(plane: LocalPlane, namespace: str, name: str) -> None:
    pod_gone(plane, namespace, name, timeout=120)


def create(plane: LocalPlane, pod: dict[str, Any]) -> None:
    plane.kubectl("create", "-f", "-", input=yaml.safe_dump(pod))


def all_vnpus(rel: Release) -> dict[str, dict[int, str]]:
    return {node: vnpu_ids(agent.sim(node)) for node, agent in rel.agents.items()}


def assert_ready_on_node(rel: Release, pod: dict[str, Any], allocs: list[dict[str, Any]]) -> None:
    node = pod["spec"]["nodeName"]
    assert node in NODES, node
    assert {a["spec"]["nodeName"] for a in allocs} == {node}
    assert [a["status"]["phase"] for a in allocs] == [names.PHASE_READY] * len(allocs)
    ids = sorted(a["spec"]["vnpuId"] for a in allocs)
    visible = pod["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES]
    assert sorted(int(x) for x in visible.split(",")) == ids
    on_node = vnpu_ids(rel.agents[node].sim(node))
    for a in allocs:
        assert on_node.get(a["spec"]["vnpuId"]) == a["spec"]["template"], on_node


def test_components_run_with_chart_credentials(plane: LocalPlane, release: Release) -> None:
    """The processes hold the chart's ServiceAccounts' tokens, not the admin certificate."""
    op_kubeconfig = Path(release.operator.extra[-1].removeprefix("--kubeconfig="))
    user = whoami(plane, op_kubeconfig)
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}"
    assert "system:masters" not in user.get("groups", [])
    for node, agent in release.agents.items():
        user = whoami(plane, Path(agent.extra[-1].removeprefix("--kubeconfig=")))
        assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
        assert user["extra"]["authentication.kubernetes.io/node-name"] == [node]
        # The agent wrote its own VNPUNode and Lease through the node-scoping policy.
        assert get_json(plane, "vnpunode", node)
        assert get_json(plane, "lease", "-n", NAMESPACE, names.lease_name(node))
    # The operator registered its loopback URL and CA on the chart's configurations.
    for kind in WEBHOOK_KINDS:
        cfg = get_json(plane, kind, names.WEBHOOK_CONFIG_NAME)
        assert cfg["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        for hook in cfg["webhooks"]:
            client = hook["clientConfig"]
            assert client["url"].startswith(f"https://127.0.0.1:{release.operator.webhook_port}")
            assert client["caBundle"]


def test_pod_lifecycle_under_chart_rbac(
    plane: LocalPlane, release: Release, namespace: str
) -> None:
    create(plane, vnpu_pod("one", namespace, template=TEMPLATE))
    one = running(plane, namespace, "one")
    (alloc,) = pod_allocations(plane, namespace, one["metadata"]["uid"])
    assert alloc["spec"]["template"] == TEMPLATE
    assert_ready_on_node(release, one, [alloc])

    create(plane, vnpu_pod("two", namespace, template=TEMPLATE, count=2))
    two = running(plane, namespace, "two")
    allocs = pod_allocations(plane, namespace, two["metadata"]["uid"])
    assert len(allocs) == 2
    assert len({a["spec"]["vnpuId"] for a in allocs}) == 2
    assert_ready_on_node(release, two, allocs)

    # 5 x LARGE fits on no node (4 at most per node).
    create(plane, vnpu_pod("huge", namespace, template=LARGE, count=5))

    def waiting() -> dict[str, Any] | None:
        pod = get_json(plane, "pod", "-n", namespace, "huge") or {}
        for cond in pod.get("status", {}).get("conditions") or []:
            if cond.get("type") == names.POD_COND_ALLOCATED and cond.get("status") == "False":
                return pod
        return None

    huge = wait_for("huge: condition Allocated=False", waiting, timeout=120, interval=0.5)
    assert not huge["spec"].get("nodeName")
    assert pod_allocations(plane, namespace, huge["metadata"]["uid"]) == []

    uids = [p["metadata"]["uid"] for p in (one, two, huge)]
    plane.kubectl("delete", "pod", "-n", namespace, "one", "two", "huge", "--wait=false")
    for name in ("one", "two", "huge"):
        gone(plane, namespace, name)
    wait_for(
        "allocations gone",
        lambda: all(not pod_allocations(plane, namespace, uid) for uid in uids),
        timeout=120,
    )
    wait_for(
        "no vNPU left",
        lambda: all(not ids for ids in all_vnpus(release).values()),
        timeout=60,
    )
    assert not release.denials(), release.denials()
    assert_writes_by_chart_identities(plane, release)


def assert_writes_by_chart_identities(plane: LocalPlane, release: Release) -> None:
    """The API server's side of the story: every write of our components (by user agent)
    came from the chart's ServiceAccounts, an agent's only with its node's claim, and none
    of their writes was refused."""
    operator_user = f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}"
    agent_user = f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
    seen = {operator_user: 0, agent_user: 0}
    for e in audit_since(plane, release.audit_offset):
        user = e.get("user") or {}
        username = user.get("username")
        agent = str(e.get("userAgent", ""))
        if agent.startswith(names.USER_AGENT_OPERATOR + "/"):
            assert username == operator_user, e
        if agent.startswith(names.USER_AGENT_AGENT + "/"):
            assert username == agent_user, e
            claim = (user.get("extra") or {}).get("authentication.kubernetes.io/node-name")
            assert (claim or [""])[0] in NODES, e
        if username in seen:
            seen[username] += 1
            assert (e.get("responseStatus") or {}).get("code") != 403, e
    assert all(seen.values()), seen


def test_documented_uninstall_order(plane: LocalPlane, release: Release, namespace: str) -> None:
    create(plane, vnpu_pod("last", namespace, template=TEMPLATE))
    last = running(plane, namespace, "last")
    (alloc,) = pod_allocations(plane, namespace, last["metadata"]["uid"])
    assert_ready_on_node(release, last, [alloc])

    # 1. Delete every vNPU pod and wait until no allocation is left.
    plane.kubectl("delete", "pod", "-n", namespace, "last", "--wait=false")
    gone(plane, namespace, "last")
    left: list[str] = []

    def none_left() -> bool:
        items = (get_json(plane, "vnpuallocations", "-A", "-l", OURS) or {}).get("items", [])
        left[:] = [f"{a['metadata']['namespace']}/{a['metadata']['name']}" for a in items]
        return not left

    try:
        wait_for("no allocation left", none_left, timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; left: {left}") from exc
    assert all(not ids for ids in all_vnpus(release).values()), all_vnpus(release)
    # 2. helm uninstall, which deletes the operator Deployment and the agent DaemonSet: the
    # processes stop with them (after it, the release's RBAC is gone and they would only
    # log the 403s of an uninstalled chart).
    release.stop()
    assert not release.denials(), release.denials()
    assert_writes_by_chart_identities(plane, release)
    helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s")

    stuck = [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in (get_json(plane, "pods", "-A") or {}).get("items", [])
        if p["metadata"].get("deletionTimestamp")
        and names.POD_FINALIZER in (p["metadata"].get("finalizers") or [])
    ]
    assert not stuck, f"pods stuck Terminating on {names.POD_FINALIZER}: {stuck}"
    for kind in WEBHOOK_KINDS:
        proc = plane.kubectl("get", kind, names.WEBHOOK_CONFIG_NAME, check=False)
        assert proc.returncode != 0, f"{kind} {names.WEBHOOK_CONFIG_NAME} left"
        assert "NotFound" in proc.stderr
    assert not (get_json(plane, "vnpuallocations", "-A", "-l", OURS) or {}).get("items")
