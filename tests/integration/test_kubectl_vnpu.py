"""`kubectl vnpu` on the real local control plane: the installed plugin run
through kubectl itself against a known cluster (two kwok nodes with
simulated chips, an agent, the operator, pods in two namespaces), its output
compared with golden files, and `why` for a waiting pod naming the blocker
the operator itself reported."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import Stack, get_json

from localplane import LocalPlane, NodeSpec
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

GOLDEN = Path(__file__).parent / "golden"
TEAM_A, TEAM_B = "cli-team-a", "cli-team-b"
# The plugin as the package installs it, next to this interpreter.
PLUGIN_DIR = Path(sys.executable).parent


def kubectl_vnpu(plane: LocalPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl vnpu ARGS`: kubectl finds kubectl-vnpu on PATH and passes
    KUBECONFIG on, as for a user's shell."""
    if not (PLUGIN_DIR / "kubectl-vnpu").exists():
        pytest.fail(f"kubectl-vnpu is not installed in {PLUGIN_DIR}: pip install -e .")
    env = {
        **os.environ,
        "PATH": f"{PLUGIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(plane.kubeconfig),
    }
    return subprocess.run(
        [plane.binary("kubectl"), "vnpu", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def normalised(text: str) -> str:
    """Allocation names carry a digest of the pod's UID."""
    return re.sub(r"-[0-9a-f]{10}-(\d+)\b", r"-<uid>-\1", text)


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def same(actual: str, name: str) -> None:
    """Compares with the golden file; a failure prints the whole output."""
    assert actual == golden(name), f"{name} differs; the plugin printed:\n{actual}"


def pod_json(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any] | None:
    got: dict[str, Any] | None = get_json(plane, "pod", "-n", namespace, name)
    return got


def allocated(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.POD_COND_ALLOCATED:
            got: dict[str, Any] = condition
            return got
    return None


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    """A plane of this module's own (it overrides the session's): status and usage
    cover the whole cluster, and the golden output must not depend on what other
    modules left behind (in the full suite it did)."""
    own = LocalPlane(Path(tmp_path_factory.mktemp("kubectl-vnpu-plane")))
    own.start(progress=lambda msg: print(f"[localplane] {msg}"))
    own.install_crds()
    yield own
    own.stop()
    own.rmtree()


@pytest.fixture(scope="module")
def cluster(plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """cli-a: one 910B3 chip, filled by team-a/big (2 x vir10_3c_32g).
    cli-b: one 310P3 chip with team-b/small (1 x vir01). team-a/wait asks for
    a vir05_1c_16g, which only 910B3 chips offer: it waits."""
    stack = Stack(
        plane,
        Path(tmp_path_factory.mktemp("kubectl-vnpu")),
        [NodeSpec(name="cli-a", chips={"910B3": 1}), NodeSpec(name="cli-b", chips={"310P3": 1})],
    ).start()
    try:
        for ns in (TEAM_A, TEAM_B):
            plane.kubectl("create", "namespace", ns)
            wait_for(
                f"ServiceAccount default in {ns}",
                lambda ns=ns: (
                    plane.kubectl(  # type: ignore[misc]
                        "get", "serviceaccount", "default", "-n", ns, check=False
                    ).returncode
                    == 0
                ),
                timeout=60,
            )
        plane.apply(vnpu_pod("big", TEAM_A, template="vir10_3c_32g", count=2))
        plane.apply(vnpu_pod("small", TEAM_B, template="vir01"))
        for ns, name in ((TEAM_A, "big"), (TEAM_B, "small")):
            wait_for(
                f"{ns}/{name} Running",
                lambda ns=ns, name=name: (  # type: ignore[misc]
                    (pod_json(plane, ns, name) or {}).get("status", {}).get("phase") == "Running"
                ),
                timeout=60,
            )
        wait_for(
            # This module's: other modules may leave allocations on nodes no agent serves.
            "every allocation of the two teams Ready",
            lambda: all(
                (a.get("status") or {}).get("phase") == names.PHASE_READY
                for ns in (TEAM_A, TEAM_B)
                for a in get_json(plane, "vnpuallocations", "-n", ns)["items"]
            ),
            timeout=60,
        )
        plane.apply(vnpu_pod("wait", TEAM_A, template="vir05_1c_16g"))
        wait_for(
            "team-a/wait told it waits",
            lambda: (
                (allocated(pod_json(plane, TEAM_A, "wait")) or {}).get("reason")
                == names.REASON_WAITING
            ),
            timeout=60,
        )
        plane.apply(vnpu_pod("plain", TEAM_A, template=None))
        # team-a's quota: the API server counts big's two vNPUs and wait's one.
        hard = {f"requests.{names.RES_VNPUS}": "4", f"requests.{names.RES_AICORE}": "30"}
        plane.apply(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "vnpu", "namespace": TEAM_A},
                "spec": {"hard": hard},
            }
        )
        wait_for(
            "team-a's quota counted",
            lambda: (
                (get_json(plane, "resourcequota", "-n", TEAM_A, "vnpu") or {})
                .get("status", {})
                .get("used")
                == {f"requests.{names.RES_VNPUS}": "3", f"requests.{names.RES_AICORE}": "25"}
            ),
            timeout=60,
        )
        yield stack
    finally:
        stack.close()
        for ns in (TEAM_A, TEAM_B):
            plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_status_golden(cluster: Stack, plane: LocalPlane) -> None:
    out = kubectl_vnpu(plane, "status")
    assert out.returncode == 0, out.stderr
    same(normalised(out.stdout), "kubectl_vnpu_status.txt")


def test_status_json_counts_the_chips(cluster: Stack, plane: LocalPlane) -> None:
    out = kubectl_vnpu(plane, "status", "-o", "json")
    assert out.returncode == 0, out.stderr
    nodes = {n["name"]: n for n in json.loads(out.stdout)["nodes"]}
    (chip_a,) = nodes["cli-a"]["chips"]
    assert chip_a["aicore"] == {"used": 20, "free": 0, "total": 20}
    assert {v["pod"] for v in chip_a["vnpus"]} == {f"{TEAM_A}/big"}
    (chip_b,) = nodes["cli-b"]["chips"]
    assert [(v["pod"], v["phase"]) for v in chip_b["vnpus"]] == [(f"{TEAM_B}/small", "Ready")]
    assert all(n["live"] for n in nodes.values())


def test_why_waiting_names_the_blocker_the_operator_reported(
    cluster: Stack, plane: LocalPlane
) -> None:
    out = kubectl_vnpu(plane, "why", "wait", "-n", TEAM_A, "-o", "json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    condition = allocated(pod_json(plane, TEAM_A, "wait"))
    assert condition is not None
    # The plugin's own placement attempt says what the operator's did.
    assert report["summary"] == condition["message"]
    assert {n["node"]: n["reason"] for n in report["nodes"]} == {
        "cli-a": "insufficient-aicore",
        "cli-b": "template-not-offered",
    }
    text = kubectl_vnpu(plane, "why", "wait", "-n", TEAM_A)
    assert text.returncode == 0, text.stderr
    same(normalised(text.stdout), "kubectl_vnpu_why_waiting.txt")


def test_why_placed_golden(cluster: Stack, plane: LocalPlane) -> None:
    out = kubectl_vnpu(plane, "why", "big", "--namespace", TEAM_A)
    assert out.returncode == 0, out.stderr
    same(normalised(out.stdout), "kubectl_vnpu_why_placed.txt")


def test_usage_golden(cluster: Stack, plane: LocalPlane) -> None:
    out = kubectl_vnpu(plane, "usage")
    assert out.returncode == 0, out.stderr
    same(out.stdout, "kubectl_vnpu_usage.txt")
    one = kubectl_vnpu(plane, "usage", "-n", TEAM_B, "-o", "json")
    assert one.returncode == 0, one.stderr
    (row,) = json.loads(one.stdout)["namespaces"]
    assert (row["namespace"], row["vnpus"], row["aicore"], row["waiting"]) == (TEAM_B, 1, 1, 0)


def test_errors_exit_non_zero(cluster: Stack, plane: LocalPlane) -> None:
    missing = kubectl_vnpu(plane, "why", "nosuch", "-n", TEAM_A)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == f'error: pod "nosuch" not found in namespace "{TEAM_A}"\n'
    plain = kubectl_vnpu(plane, "why", "plain", "-n", TEAM_A)
    assert plain.returncode == 1
    assert plain.stderr == (
        f"error: pod {TEAM_A}/plain does not ask for vNPUs (no {names.ANN_TEMPLATE} annotation, "
        f"and no {names.RESOURCE_PREFIX}<template> in its containers' resources.limits)\n"
    )


def cordoned_chips(plane: LocalPlane, node: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = (get_json(plane, "vnpunode", node).get("spec") or {}).get(
        "cordonedChips"
    ) or []
    return got


def test_cordon_shows_blocks_and_uncordon_frees(cluster: Stack, plane: LocalPlane) -> None:
    """Runs last: it cordons cli-b's only chip with the plugin and uncordons it."""
    out = kubectl_vnpu(plane, "cordon", "cli-b", "0", "--reason", "fan failing")
    assert (out.returncode, out.stdout) == (0, "vnpunode/cli-b chip 0 cordoned (fan failing)\n")
    try:
        assert cordoned_chips(plane, "cli-b") == [{"chip": 0, "reason": "fan failing"}]
        out = kubectl_vnpu(plane, "status", "-o", "json")
        assert out.returncode == 0, out.stderr
        chips = {n["name"]: n["chips"][0]["cordon"] for n in json.loads(out.stdout)["nodes"]}
        assert chips == {"cli-a": None, "cli-b": "fan failing"}
        plane.apply(vnpu_pod("tiny", TEAM_B, template="vir01"))
        wait_for(
            "team-b/tiny told it waits",
            lambda: (
                (allocated(pod_json(plane, TEAM_B, "tiny")) or {}).get("reason")
                == names.REASON_WAITING
            ),
            timeout=60,
        )
        why = kubectl_vnpu(plane, "why", "tiny", "-n", TEAM_B, "-o", "json")
        assert why.returncode == 0, why.stderr
        report = json.loads(why.stdout)
        assert {n["node"]: n["reason"] for n in report["nodes"]} == {
            "cli-a": "template-not-offered",
            "cli-b": "cordoned",
        }
        assert report["summary"] == (allocated(pod_json(plane, TEAM_B, "tiny")) or {})["message"]
    finally:
        out = kubectl_vnpu(plane, "uncordon", "cli-b", "0")
    assert (out.returncode, out.stdout) == (0, "vnpunode/cli-b chip 0 uncordoned\n")
    assert cordoned_chips(plane, "cli-b") == []
    wait_for(
        "team-b/tiny placed once the chip is back",
        lambda: (pod_json(plane, TEAM_B, "tiny") or {}).get("status", {}).get("phase") == "Running",
        timeout=60,
    )


def test_concurrent_cordons_of_one_node_both_land(cluster: Stack, plane: LocalPlane) -> None:
    """Each write carries the resourceVersion it read: the loser of a race gets
    a 409, reads again and adds its chip to the winner's list."""
    env = {
        **os.environ,
        "PATH": f"{PLUGIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(plane.kubeconfig),
    }
    procs = [
        subprocess.Popen(
            [plane.binary("kubectl"), "vnpu", "cordon", "cli-a", str(chip), "--reason", f"r{chip}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for chip in range(6)
    ]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        assert cordoned_chips(plane, "cli-a") == [
            {"chip": chip, "reason": f"r{chip}"} for chip in range(6)
        ]
    finally:
        plane.kubectl(
            "patch", "vnpunode", "cli-a", "--type=merge", "-p", '{"spec":{"cordonedChips":null}}'
        )


def test_a_namespace_user_cannot_cordon(cluster: Stack, plane: LocalPlane, tmp_path: Path) -> None:
    user = plane.token_kubeconfig(tmp_path / "user.kubeconfig", "default", TEAM_A)
    out = kubectl_vnpu(plane, "cordon", "cli-b", "0", "--reason", "mine", "--kubeconfig", str(user))
    assert out.returncode == 1
    assert out.stderr.startswith("error: not allowed to get vnpunode cli-b"), out.stderr
    assert cordoned_chips(plane, "cli-b") == []
