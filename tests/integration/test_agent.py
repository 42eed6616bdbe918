"""The node agent as a real process, on the real control plane, with the
sim driver: allocations in, vNPUs out, and nothing destroyed that is owned."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import add_node, allocation, create, get_alloc, phase
from prometheus_client.parser import text_string_to_metric_families

from localplane import LocalPlane
from localplane.components import AGENT_NAMESPACE, AgentProcess, vnpu_ids
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

_counter = iter(range(1000))


@pytest.fixture
def node(plane: LocalPlane) -> str:
    """A fresh kwok node with 2 simulated 910B3 chips and 1 310P3 chip."""
    return add_node(plane, f"agent-node-{next(_counter)}", {"910B3": 2, "310P3": 1})


@pytest.fixture
def agent(plane: LocalPlane, node: str, namespace: str, tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(plane, tmp_path, [node]).start()
    yield proc
    _release_then_stop(plane, namespace, proc)


def _release_then_stop(plane: LocalPlane, namespace: str, agent: AgentProcess) -> None:
    """The test's allocations go while the agent still runs (it destroys their
    vNPUs and removes their finalizers); those of nodes nobody serves lose
    their finalizer by hand. Left behind, they would stay on the shared plane
    for later modules (a chart's uninstall hook counts every allocation)."""
    try:
        plane.kubectl("delete", names.ALLOCATION_PLURAL, "--all", "-n", namespace,
                      "--wait=false", check=False)  # fmt: skip
        try:
            wait_for("the test's allocations gone", lambda: not _allocations(plane, namespace), 20)
        except AssertionError:
            for name in _allocations(plane, namespace):
                plane.kubectl("patch", names.ALLOCATION_PLURAL, name, "-n", namespace,
                              "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                              check=False)  # fmt: skip
    finally:
        agent.kill(signal.SIGTERM)


def _allocations(plane: LocalPlane, namespace: str) -> list[str]:
    got = plane.get_json(names.ALLOCATION_PLURAL, "-n", namespace) or {}
    return [a["metadata"]["name"] for a in got.get("items", [])]


def _ready(plane: LocalPlane, ns: str, name: str) -> bool:
    return phase(plane, ns, name) == names.PHASE_READY


def test_allocation_becomes_ready_with_exactly_its_vnpu(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    create(
        plane, namespace, allocation("a1", node=node, vnpu_id=117, chip=1, template="vir10_3c_32g")
    )
    wait_for("allocation Ready", lambda: _ready(plane, namespace, "a1"))
    obj = get_alloc(plane, namespace, "a1")
    assert obj is not None
    status = obj["status"]
    assert status["devicePath"] == "/dev/vdavinci117"
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    assert conds == {"Ready": "True", "Healthy": "True"}
    assert vnpu_ids(agent.sim(node)) == {117: "vir10_3c_32g"}
    cdi = json.loads((agent.cdi_dir / f"vnpu.io-{node}-vnpu117.json").read_text())
    assert cdi["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == "/dev/vdavinci117"

    def inventory_shows_owner() -> bool:
        r = plane.kubectl("get", names.NODE_PLURAL, node, "-o", "json", check=False)
        if r.returncode != 0:
            return False
        chips = json.loads(r.stdout)["status"]["chips"]
        owned = [v for c in chips for v in c.get("vnpus", [])]
        return owned == [
            {"id": 117, "template": "vir10_3c_32g", "inUse": False,
             "allocation": f"{namespace}/a1", "podUID": "uid"}
        ]  # fmt: skip

    wait_for("VNPUNode lists the vNPU and its owner", inventory_shows_owner)
    lease = plane.kubectl("get", "lease", names.lease_name(node), "-n", AGENT_NAMESPACE)
    assert lease.returncode == 0


def test_unopened_vnpu_survives_many_gc_rounds(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    """Premature destroy: a Running pod that has not opened its vNPU keeps it."""
    create(plane, namespace, allocation("idle", node=node, vnpu_id=100))
    wait_for("Ready", lambda: _ready(plane, namespace, "idle"))
    time.sleep(8)  # 16 resyncs at 0.5 s, four times the 2 s grace period
    assert vnpu_ids(agent.sim(node)) == {100: "vir05_1c_16g"}
    assert not agent.sim(node).list_vnpus(0)[0].in_use
    assert _ready(plane, namespace, "idle")
    orphan_series = f'vnpu_agent_gc_actions_total{{node="{node}",reason="orphan"}}'
    assert orphan_series not in agent.metrics()


def test_deleting_an_allocation_destroys_its_vnpu_then_lets_it_go(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    create(plane, namespace, allocation("gone", node=node, vnpu_id=101))
    wait_for("Ready", lambda: _ready(plane, namespace, "gone"))
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "gone", "-n", namespace, "--wait=false")
    wait_for("allocation gone", lambda: get_alloc(plane, namespace, "gone") is None)
    assert vnpu_ids(agent.sim(node)) == {}
    assert not (agent.cdi_dir / f"vnpu.io-{node}-vnpu101.json").exists()


def test_in_use_vnpu_is_destroyed_only_after_release(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    create(plane, namespace, allocation("busy", node=node, vnpu_id=102))
    wait_for("Ready", lambda: _ready(plane, namespace, "busy"))
    sim = agent.sim(node)
    sim.open_vnpu(102)
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "busy", "-n", namespace, "--wait=false")
    wait_for("Releasing", lambda: phase(plane, namespace, "busy") == names.PHASE_RELEASING)
    time.sleep(3)
    assert 102 in vnpu_ids(sim)
    obj = get_alloc(plane, namespace, "busy")
    assert obj is not None
    assert "still open in a container" in obj["status"]["message"]
    sim.release_vnpu(102)
    wait_for("allocation gone", lambda: get_alloc(plane, namespace, "busy") is None, timeout=20)
    assert vnpu_ids(sim) == {}


def test_sigkill_between_create_and_status_leaves_no_leak_or_duplicate(
    plane: LocalPlane, namespace: str, node: str, tmp_path: Path
) -> None:
    agent = AgentProcess(plane, tmp_path, [node], env={"VNPU_FAILPOINTS": "after-create=60"})
    agent.start()
    try:
        create(plane, namespace, allocation("crash", node=node, vnpu_id=103))
        wait_for("vNPU created", lambda: 103 in vnpu_ids(agent.sim(node)))
        agent.kill(signal.SIGKILL)
        assert phase(plane, namespace, "crash") is None  # status was never written
        agent.env = {}
        agent.start(env={"VNPU_FAILPOINTS": ""})
        wait_for("Ready after restart", lambda: _ready(plane, namespace, "crash"))
        obj = get_alloc(plane, namespace, "crash")
        assert obj is not None
        ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "Adopted"
        assert vnpu_ids(agent.sim(node)) == {103: "vir05_1c_16g"}
        plane.kubectl("delete", names.ALLOCATION_PLURAL, "crash", "-n", namespace, "--wait=false")
        wait_for("gone", lambda: get_alloc(plane, namespace, "crash") is None)
        assert vnpu_ids(agent.sim(node)) == {}
    finally:
        _release_then_stop(plane, namespace, agent)


def test_reboot_replay_keeps_live_vnpus_and_collects_orphans(
    plane: LocalPlane, namespace: str, node: str, tmp_path: Path
) -> None:
    agent = AgentProcess(plane, tmp_path, [node]).start()
    try:
        create(plane, namespace, allocation("live", node=node, vnpu_id=104))
        create(plane, namespace, allocation("dead", node=node, vnpu_id=105))
        wait_for(
            "both Ready",
            lambda: _ready(plane, namespace, "live") and _ready(plane, namespace, "dead"),
        )
        agent.kill(signal.SIGKILL)
        # While the agent is down, "dead" is force-released (finalizer
        # removed by hand), so nobody destroys its vNPU; then the node reboots
        # and config-recover replays both vNPUs.
        plane.kubectl(
            "patch", names.ALLOCATION_PLURAL, "dead", "-n", namespace, "--type=merge",
            "-p", '{"metadata": {"finalizers": null}}',
        )  # fmt: skip
        plane.kubectl("delete", names.ALLOCATION_PLURAL, "dead", "-n", namespace)
        sim = agent.sim(node)
        report = sim.reboot()
        assert vnpu_ids(sim) == {104: "vir05_1c_16g", 105: "vir05_1c_16g"}, report
        agent.start()
        wait_for("orphan 105 collected", lambda: 105 not in vnpu_ids(sim), timeout=30)
        assert vnpu_ids(sim) == {104: "vir05_1c_16g"}
        assert _ready(plane, namespace, "live")
        assert (
            f'vnpu_agent_gc_actions_total{{node="{node}",reason="orphan"}} 1.0' in agent.metrics()
        )
    finally:
        _release_then_stop(plane, namespace, agent)


def test_reboot_without_replay_recreates_live_vnpus(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    create(plane, namespace, allocation("again", node=node, vnpu_id=106))
    wait_for("Ready", lambda: _ready(plane, namespace, "again"))
    sim = agent.sim(node)
    sim.set_config_recover(False)
    sim.reboot()
    wait_for("vNPU recreated", lambda: vnpu_ids(sim) == {106: "vir05_1c_16g"})
    assert _ready(plane, namespace, "again")


def test_foreign_vnpus_are_kept_and_reported_by_default(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    sim = agent.sim(node)
    sim.create_vnpu(0, "vir05_1c_16g", 107)  # made by someone else (npu-smi by hand)
    metric = f'vnpu_agent_gc_actions_total{{node="{node}",reason="kept-foreign"}}'
    wait_for("foreign vNPU reported", lambda: metric in agent.metrics(), timeout=20)
    assert 107 in vnpu_ids(sim)
    foreign = {"node": node, "chip": "0", "state": "foreign", "template": "vir05_1c_16g"}
    assert [
        s.value
        for family in text_string_to_metric_families(agent.metrics())
        for s in family.samples
        if s.name == "vnpu_agent_vnpus" and foreign.items() <= s.labels.items()
    ] == [1.0]


@pytest.mark.parametrize(
    ("template", "chip", "reason", "text"),
    [
        ("vir01", 0, "InvalidTemplate", "vir01"),
        ("vir05_1c_8g", 0, "InvalidTemplate", "vir05_1c_8g"),
    ],
)
def test_unknown_template_fails_with_the_drivers_reason(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess,
    template: str, chip: int, reason: str, text: str,
) -> None:  # fmt: skip
    create(
        plane, namespace, allocation("badtpl", node=node, vnpu_id=100, template=template, chip=chip)
    )
    wait_for("Failed", lambda: phase(plane, namespace, "badtpl") == names.PHASE_FAILED)
    obj = get_alloc(plane, namespace, "badtpl")
    assert obj is not None
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == reason
    assert text in obj["status"]["message"]
    assert vnpu_ids(agent.sim(node)) == {}


def test_full_chip_fails_with_the_kernel_message(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    for i, vid in enumerate((100, 101)):
        create(
            plane, namespace, allocation(f"big{i}", node=node, vnpu_id=vid, template="vir10_3c_32g")
        )
    wait_for(
        "two Ready", lambda: _ready(plane, namespace, "big0") and _ready(plane, namespace, "big1")
    )
    create(plane, namespace, allocation("over", node=node, vnpu_id=102))
    wait_for("Failed", lambda: phase(plane, namespace, "over") == names.PHASE_FAILED)
    obj = get_alloc(plane, namespace, "over")
    assert obj is not None
    assert "check aicore num failed" in obj["status"]["message"]
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InsufficientCapacity"
    # Deleting a Failed allocation has nothing to destroy and lets it go.
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "over", "-n", namespace, "--wait=false")
    wait_for("gone", lambda: get_alloc(plane, namespace, "over") is None)
    assert sorted(vnpu_ids(agent.sim(node))) == [100, 101]


def test_id_taken_by_another_template_is_a_mismatch(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    agent.sim(node).create_vnpu(0, "vir10_3c_32g", 108)
    create(plane, namespace, allocation("clash", node=node, vnpu_id=108))
    wait_for("Failed", lambda: phase(plane, namespace, "clash") == names.PHASE_FAILED)
    obj = get_alloc(plane, namespace, "clash")
    assert obj is not None
    assert "already exists on chip 0 with template vir10_3c_32g" in obj["status"]["message"]
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "clash", "-n", namespace, "--wait=false")
    wait_for("gone", lambda: get_alloc(plane, namespace, "clash") is None)
    assert vnpu_ids(agent.sim(node)) == {108: "vir10_3c_32g"}  # not ours: never destroyed


def test_agent_ignores_other_nodes_allocations(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    create(plane, namespace, allocation("mine", node=node, vnpu_id=100))
    create(plane, namespace, allocation("theirs", node="some-other-node", vnpu_id=101))
    wait_for("mine Ready", lambda: _ready(plane, namespace, "mine"))
    time.sleep(2)
    theirs = get_alloc(plane, namespace, "theirs")
    assert theirs is not None
    assert "status" not in theirs
    assert vnpu_ids(agent.sim(node)) == {100: "vir05_1c_16g"}
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "theirs", "-n", namespace, "--wait=false")
    time.sleep(2)
    left = get_alloc(plane, namespace, "theirs")
    assert left is not None
    assert left["metadata"]["finalizers"] == [names.ALLOCATION_FINALIZER]


def test_driver_errors_are_reported_and_retried_not_crashes(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    sim = agent.sim(node)
    sim.inject_failure("create", -8005, times=2, message="dcmi create vdevice failed")
    create(plane, namespace, allocation("flaky", node=node, vnpu_id=109))
    # Transient failures are reported on the allocation, then retried.
    wait_for("Ready after retries", lambda: _ready(plane, namespace, "flaky"), timeout=30)
    assert 'result="DriverFailure"' in agent.metrics()
    events = plane.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert "dcmi create vdevice failed" in events
    # A query failure makes the node not ready, and the agent keeps running.
    sim.inject_failure("query", -8005)
    wait_for("readyz 503", lambda: not agent.ready(), timeout=20)
    sim.clear_faults()
    wait_for("ready again", agent.ready, timeout=20)
    assert _ready(plane, namespace, "flaky")


def test_metrics_drop_series_of_deleted_allocations(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    create(plane, namespace, allocation("metered", node=node, vnpu_id=110))
    wait_for("Ready", lambda: _ready(plane, namespace, "metered"))
    series = 'allocation="metered"'
    wait_for("series present", lambda: series in agent.metrics())
    plane.kubectl("delete", names.ALLOCATION_PLURAL, "metered", "-n", namespace, "--wait=false")
    wait_for("gone", lambda: get_alloc(plane, namespace, "metered") is None)
    wait_for("series dropped", lambda: series not in agent.metrics())
    assert 'state="allocated"' not in agent.metrics()


def test_unhealthy_chip_is_reflected_in_conditions_inventory_and_events(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    create(plane, namespace, allocation("sick", node=node, vnpu_id=117, chip=1))
    wait_for("Ready", lambda: _ready(plane, namespace, "sick"))
    agent.sim(node).set_chip_health(1, False)

    def healthy_condition() -> str | None:
        obj = get_alloc(plane, namespace, "sick") or {}
        conds = obj.get("status", {}).get("conditions", [])
        return next((c["status"] for c in conds if c["type"] == "Healthy"), None)

    wait_for("Healthy False", lambda: healthy_condition() == "False")

    def chip_health() -> str:
        r = plane.kubectl("get", names.NODE_PLURAL, node, "-o", "json")
        return str(json.loads(r.stdout)["status"]["chips"][1]["health"])

    wait_for("VNPUNode chip Unhealthy", lambda: chip_health() == "Unhealthy")
    events = plane.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert "ChipUnhealthy" in events
    assert 117 in vnpu_ids(agent.sim(node))  # an unhealthy chip is reported, not emptied
    agent.sim(node).set_chip_health(1, True)
    wait_for("Healthy True again", lambda: healthy_condition() == "True")


def test_an_allocation_that_outlived_its_namespace_is_released_as_docs_helm_says(
    plane: LocalPlane, node: str
) -> None:
    """A namespace can go while an allocation in it still has its finalizer: seen
    on this plane after an API server restart (test_agent_apiserver_restart), when
    the namespace controller finished a namespace whose custom resources it did not
    list. The object then refuses every write, the documented patch included;
    docs/HELM.md, Uninstall, says to create the namespace again first. Here the
    namespace is finalized by hand, as the controller did."""
    ns = f"orphan-{next(_counter)}"
    plane.kubectl("create", "namespace", ns)
    create(plane, ns, allocation("stranded", node=node, vnpu_id=110))
    plane.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for(
        "the namespace controller deleting the allocation",
        lambda: (
            (get_alloc(plane, ns, "stranded") or {}).get("metadata", {}).get("deletionTimestamp")
        ),
        timeout=60,
    )
    finalized = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": ns}, "spec": {"finalizers": []}}  # fmt: skip
    plane.kubectl("replace", "--raw", f"/api/v1/namespaces/{ns}/finalize", "-f", "-",
                  input=json.dumps(finalized))  # fmt: skip
    wait_for(
        "the namespace gone",
        lambda: plane.kubectl("get", "namespace", ns, check=False).returncode != 0,
    )
    assert get_alloc(plane, ns, "stranded") is not None  # outlived its namespace

    patch = ("patch", "vnpua", "stranded", "-n", ns, "--type=merge",
             "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
    refused = plane.kubectl(*patch, check=False)
    assert refused.returncode != 0
    assert f'namespaces "{ns}" not found' in refused.stderr, refused.stderr
    plane.kubectl("create", "namespace", ns)
    try:
        plane.kubectl(*patch)
        wait_for("the allocation gone", lambda: get_alloc(plane, ns, "stranded") is None)
    finally:
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
