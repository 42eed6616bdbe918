"""The agent's view of its allocations converges after the API server is
killed (SIGKILL) and started again with the same flags (issue 12, item 1,
the agent's side): allocations deleted while its watch was down, or around
the crash, are released (vNPU destroyed, finalizer removed), those removed
by hand are collected as orphans, and those created meanwhile get their
vNPU. Real agent process, real control plane (`LocalPlane.restart_apiserver`
and friends), sim driver."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import add_node, allocation, create, get_alloc, phase

from localplane import LocalPlane
from localplane.components import AgentProcess, vnpu_ids
from localplane.plane import PlaneError
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

TEMPLATE = "vir05_1c_16g"  # 4 per 910B3 chip
CHIPS = 16
WORKERS = 3  # churning threads of the second test
CONVERGE_WITHIN = 60.0

_counter = iter(range(1000))


@pytest.fixture
def node(plane: LocalPlane) -> str:
    return add_node(plane, f"restart-node-{next(_counter)}", {"910B3": CHIPS})


@pytest.fixture
def agent(plane: LocalPlane, node: str, tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(plane, tmp_path, [node]).start()
    yield proc
    if proc.proc is not None:
        proc.proc.send_signal(signal.SIGCONT)  # a failed test may leave it stopped
    # Whatever a failed test left: never a kube-apiserver that is down for the next test.
    if plane.procs["kube-apiserver"].poll() is not None:
        plane.start_apiserver()
    # Release what the test left on the node while its agent still runs: once it
    # is gone nobody removes their finalizers, and later tests that expect no
    # allocation anywhere (the chart's uninstall order) would wait for ever.
    selector = f"{names.LABEL_NODE}={node}"
    plane.kubectl(
        "delete", names.ALLOCATION_PLURAL, "-A", "-l", selector, "--wait=false", check=False
    )

    def released() -> bool:
        r = plane.kubectl("get", names.ALLOCATION_PLURAL, "-A", "-l", selector, "-o", "name")
        return not r.stdout.strip()

    wait_for(f"allocations of {node} released", released, timeout=60)
    proc.kill(signal.SIGTERM)


def chip(i: int) -> int:
    return i % CHIPS


def vnpu_id(i: int) -> int:
    """Allocation number `i`'s vNPU id, in its chip's range of 16 (unique for i < 256)."""
    return 100 + 16 * chip(i) + (i // CHIPS) % 16


def add(plane: LocalPlane, namespace: str, node: str, name: str, i: int) -> bool:
    """Creates allocation `name` with vNPU `vnpu_id(i)`; True once it exists
    (also when an earlier try made it and only the answer was lost)."""
    try:
        create(
            plane,
            namespace,
            allocation(name, node=node, vnpu_id=vnpu_id(i), chip=chip(i), template=TEMPLATE),
        )
    except PlaneError as exc:
        if "AlreadyExists" not in str(exc):
            return False
    return True


def delete(plane: LocalPlane, namespace: str, name: str) -> bool:
    """Asks for the deletion (the agent's finalizer then holds the object
    until it has released the vNPU); True once the API server took it."""
    r = plane.kubectl(
        "delete", names.ALLOCATION_PLURAL, name, "-n", namespace, "--wait=false",
        "--ignore-not-found", check=False, timeout=20,
    )  # fmt: skip
    return r.returncode == 0


def force_remove(plane: LocalPlane, namespace: str, name: str) -> None:
    """Deletes and strips the finalizer by hand: the object goes at once,
    nobody releases its vNPU (the agent's garbage collector must)."""
    delete(plane, namespace, name)
    plane.kubectl(
        "patch", names.ALLOCATION_PLURAL, name, "-n", namespace, "--type=merge",
        "-p", '{"metadata": {"finalizers": null}}',
    )  # fmt: skip


def converged(
    plane: LocalPlane, namespace: str, agent: AgentProcess, node: str, live: dict[str, int]
) -> None:
    """Exactly the allocations `live` (name -> i) exist and are Ready, and
    the driver holds exactly their vNPUs."""
    want = {vnpu_id(i): TEMPLATE for i in live.values()}

    def check() -> tuple[bool, object]:
        items = (plane.get_json(names.ALLOCATION_PLURAL, "-n", namespace) or {}).get("items", [])
        present = {o["metadata"]["name"]: o.get("status", {}).get("phase") for o in items}
        held = vnpu_ids(agent.sim(node))
        ok = present == dict.fromkeys(live, names.PHASE_READY) and held == want
        unready = {
            o["metadata"]["name"]: (
                o.get("status", {}).get("message"),
                o["metadata"].get("deletionTimestamp"),
            )
            for o in items
            if o.get("status", {}).get("phase") != names.PHASE_READY
        }
        return ok, (present, held, unready)

    try:
        wait_for("agent converged", lambda: check()[0], timeout=CONVERGE_WITHIN, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nallocations, vNPUs, not Ready: {check()[1]}\n"
            f"wanted: {sorted(live)}, {want}\n"
            f"agent log:\n{agent.log_tail(60)}"
        ) from exc


def all_ready(plane: LocalPlane, namespace: str, live: dict[str, int]) -> None:
    wait_for(
        "allocations Ready",
        lambda: all(phase(plane, namespace, n) == names.PHASE_READY for n in live),
        timeout=60,
    )


def test_changes_while_the_agent_and_the_api_server_are_down_converge(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    """The agent is frozen (SIGSTOP) around the crash, so that its watch
    misses for sure what happens after it: its stream breaks while it cannot
    read, and the changes made after the restart reach it only through a new
    watch or list."""
    live = {f"a{i}": i for i in range(8)}
    for name, i in live.items():
        assert add(plane, namespace, node, name, i)
    all_ready(plane, namespace, live)
    assert agent.proc is not None

    agent.proc.send_signal(signal.SIGSTOP)
    try:
        # Before the crash: on the old stream, which the agent reads only later.
        for name in ("a0", "a1"):
            assert delete(plane, namespace, name)
            del live[name]
        force_remove(plane, namespace, "a2")
        del live["a2"]
        assert add(plane, namespace, node, "b8", 8)
        live["b8"] = 8
        plane.restart_apiserver()
        # After the restart: never on the old stream.
        for name in ("a3", "a4"):
            assert delete(plane, namespace, name)
            del live[name]
        force_remove(plane, namespace, "a5")
        del live["a5"]
        for name, i in (("b9", 9), ("b10", 10)):
            assert add(plane, namespace, node, name, i)
            live[name] = i
    finally:
        agent.proc.send_signal(signal.SIGCONT)

    converged(plane, namespace, agent, node, live)
    for name in ("a0", "a1", "a3", "a4"):
        assert get_alloc(plane, namespace, name) is None
    wait_for("agent ready again", agent.ready, timeout=60)


def test_churn_through_two_api_server_crashes_converges(
    plane: LocalPlane, namespace: str, node: str, agent: AgentProcess
) -> None:
    """Allocations created and deleted without pause while the API server is
    killed twice: requests in flight at the crash, events never sent, a
    watch resumed or re-listed. Every intent is repeated once the server is
    back (a request cut by the crash may or may not have happened); then the
    agent must hold exactly the vNPUs of what is left, and every deleted
    allocation must be gone (its finalizer removed by the agent)."""
    live: dict[str, int] = {}
    deleted: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def churn(worker: int) -> None:
        # Each worker keeps at most 4 allocations and deletes the oldest as
        # it creates the next, each on another chip: at most 12 live at once
        # on 16 chips of 4 vNPUs, room for those still being released too
        # (no operator re-places an allocation refused for capacity). A
        # worker's vNPU ids (i = worker, worker + 3, ...) repeat only after
        # 42 allocations.
        n = 0
        while not stop.is_set():
            name = f"w{worker}-{n}"
            i = (worker + WORKERS * n) % (WORKERS * 42)
            with lock:
                live[name] = i
            if not add(plane, namespace, node, name, i):
                time.sleep(0.3)  # the API server is down: fewer names, same churn
            if n >= 4:
                old = f"w{worker}-{n - 4}"
                with lock:
                    live.pop(old, None)
                    deleted.add(old)
                delete(plane, namespace, old)
            n += 1

    workers = [threading.Thread(target=churn, args=(w,), daemon=True) for w in range(WORKERS)]
    for w in workers:
        w.start()
    try:
        for _ in range(2):
            time.sleep(3)
            plane.kill_apiserver()
            time.sleep(1)
            plane.start_apiserver()
        time.sleep(3)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)

    # Repeat every intent: what the crash cut may not have happened.
    for name in sorted(deleted):
        assert delete(plane, namespace, name)
    for name, i in sorted(live.items()):
        assert add(plane, namespace, node, name, i)
    print(f"\n{len(deleted)} deleted, {len(live)} left: {sorted(live)}")
    assert len(deleted) >= 12
    converged(plane, namespace, agent, node, live)
    wait_for("agent ready again", agent.ready, timeout=60)
