"""Fault injection in the simulator."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from vnpu_agent.drivers.base import (
    CapacityError,
    DriverFailure,
    InUseError,
    NotFoundError,
)
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.drivers.sim.state import SimStateError

MakeSim = Callable[..., SimDriver]


def test_create_fails_with_the_chosen_code(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.inject_failure("create", -8009, message="ioctl failed")
    for _ in range(2):
        with pytest.raises(DriverFailure, match="injected fault") as caught:
            sim.create_vnpu(0, "vir05_1c_16g", 100)
        assert caught.value.code == -8009
        assert caught.value.driver_message == "ioctl failed"
    assert sim.list_vnpus(0) == []
    sim.clear_faults()
    sim.create_vnpu(0, "vir05_1c_16g", 100)


def test_failure_only_n_times(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.inject_failure("create", times=2)
    for _ in range(2):
        with pytest.raises(DriverFailure):
            sim.create_vnpu(0, "vir05_1c_16g", 100)
    assert sim.create_vnpu(0, "vir05_1c_16g", 100).id == 100
    assert sim.snapshot()["faults"]["failures"] == {}


def test_count_is_shared_between_instances(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.inject_failure("destroy", times=1)
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    with pytest.raises(DriverFailure):
        SimDriver(sim.state_path).destroy_vnpu(0, 100)
    sim.destroy_vnpu(0, 100)  # the one failure was used up by the other instance


def test_code_picks_the_error_type(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.inject_failure("destroy", -8020)
    with pytest.raises(InUseError):
        sim.destroy_vnpu(0, 100)
    sim.inject_failure("create", -8020)
    with pytest.raises(CapacityError):
        sim.create_vnpu(0, "vir05_1c_16g", 101)


def test_create_that_fails_mid_way_leaves_the_vnpu(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.inject_failure("create", times=1, after=True)
    with pytest.raises(DriverFailure):
        sim.create_vnpu(0, "vir05_1c_16g", 100)
    assert [v.id for v in sim.list_vnpus(0)] == [100]
    assert len(sim.snapshot()["recover_lines"]) == 1


def test_destroy_that_fails_mid_way_removes_the_vnpu(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.inject_failure("destroy", times=1, after=True)
    with pytest.raises(DriverFailure):
        sim.destroy_vnpu(0, 100)
    assert sim.list_vnpus(0) == []


def test_failing_queries(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.inject_failure("query", -8005, times=4)
    for query in (
        sim.list_chips,
        lambda: sim.list_vnpus(0),
        lambda: sim.list_templates(0),
        sim.config_recover_enabled,
    ):
        with pytest.raises(DriverFailure) as caught:
            query()
        assert caught.value.code == -8005
    assert len(sim.list_chips()) == 1


def test_a_query_writes_the_state_only_when_its_fault_fires(make_sim: MakeSim) -> None:
    """Queries are not serialized again to find they changed nothing
    (StateStore.transaction, query): the file stays as it was, but the count
    of a fault one fired is still written."""
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    written = sim.state_path.stat().st_ino
    sim.list_chips(), sim.list_vnpus(0), sim.list_templates(0), sim.query_vnpu(100)
    assert sim.state_path.stat().st_ino == written
    sim.inject_failure("query", -8005, times=2)
    for _ in range(2):
        with pytest.raises(DriverFailure):
            sim.list_vnpus(0)
    assert [v.id for v in sim.list_vnpus(0)] == [100]
    assert sim.snapshot()["faults"]["failures"] == {}


def test_slow_operations(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.inject_slow("query", 0.3)
    start = time.monotonic()
    sim.list_chips()
    assert time.monotonic() - start >= 0.3
    sim.inject_slow("query", 0)
    start = time.monotonic()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.list_vnpus(0)
    assert time.monotonic() - start < 0.3


def test_slow_call_does_not_hold_the_lock(make_sim: MakeSim) -> None:
    import threading

    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.inject_slow("destroy", 0.5)
    outcome: list[BaseException | None] = []

    def destroy() -> None:
        try:
            sim.destroy_vnpu(0, 100)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=destroy)
    worker.start()
    time.sleep(0.1)
    start = time.monotonic()
    sim.open_vnpu(100)  # a container opens it while the destroy is on its way
    assert time.monotonic() - start < 0.3
    worker.join()
    assert len(outcome) == 1
    assert isinstance(outcome[0], InUseError)
    assert [v.in_use for v in sim.list_vnpus(0)] == [True]


def test_unhealthy_chip(make_sim: MakeSim) -> None:
    sim = make_sim("910B3=2")
    sim.set_chip_health(1, False)
    assert [c.healthy for c in sim.list_chips()] == [True, False]
    with pytest.raises(DriverFailure, match="chip 1 is unhealthy") as caught:
        sim.create_vnpu(1, "vir05_1c_16g", 116)
    assert "abnormal" in caught.value.driver_message
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.set_chip_health(1, True)
    sim.create_vnpu(1, "vir05_1c_16g", 116)


def test_stuck_vnpu_never_frees(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.mark_stuck(100)
    assert sim.release_vnpu(100).in_use
    with pytest.raises(InUseError):
        sim.destroy_vnpu(0, 100)
    sim.clear_faults()
    assert not sim.release_vnpu(100).in_use
    sim.destroy_vnpu(0, 100)


def test_vanished_vnpu_breaks_queries_of_it(make_sim: MakeSim) -> None:
    sim = make_sim()
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.create_vnpu(0, "vir05_1c_16g", 101)
    sim.mark_vanished(101)
    with pytest.raises(DriverFailure, match="querying vNPU 101 failed") as caught:
        sim.list_vnpus(0)
    assert caught.value.code == -8005
    with pytest.raises(DriverFailure) as single:
        sim.query_vnpu(101)
    assert single.value.code == -8005
    assert sim.query_vnpu(100).id == 100
    with pytest.raises(NotFoundError):
        sim.open_vnpu(101)
    assert sim.list_chips()[0].aicore_free == 10  # it still holds its share
    sim.destroy_vnpu(0, 101)  # the way out
    assert [v.id for v in sim.list_vnpus(0)] == [100]


def test_query_of_a_missing_vnpu(make_sim: MakeSim) -> None:
    with pytest.raises(NotFoundError) as caught:
        make_sim().query_vnpu(100)
    assert caught.value.code == -8005


def test_faults_on_missing_vnpus_are_refused(make_sim: MakeSim) -> None:
    sim = make_sim()
    with pytest.raises(NotFoundError):
        sim.mark_stuck(100)
    with pytest.raises(NotFoundError):
        sim.mark_vanished(100)
    with pytest.raises(NotFoundError):
        sim.set_chip_health(3, False)


@pytest.mark.parametrize("op", ["boot", "list", ""])
def test_unknown_operations_are_refused(make_sim: MakeSim, op: str) -> None:
    sim = make_sim()
    with pytest.raises(SimStateError, match="unknown operation"):
        sim.inject_failure(op)
    with pytest.raises(SimStateError, match="unknown operation"):
        sim.inject_slow(op, 1)


def test_times_must_be_positive(make_sim: MakeSim) -> None:
    with pytest.raises(SimStateError, match="at least 1"):
        make_sim().inject_failure("create", times=0)


def test_test_faults_survive_reboot_but_vnpu_faults_do_not(make_sim: MakeSim) -> None:
    sim = make_sim("910B3=2")
    sim.create_vnpu(0, "vir05_1c_16g", 100)
    sim.create_vnpu(0, "vir05_1c_16g", 101)
    sim.mark_stuck(100)
    sim.mark_vanished(101)
    sim.set_chip_health(1, False)
    sim.inject_failure("destroy", -8009)
    sim.reboot()
    faults = sim.snapshot()["faults"]
    assert faults["stuck"] == []
    assert faults["vanished"] == []
    assert faults["unhealthy_chips"] == [1]
    assert set(faults["failures"]) == {"destroy"}
    assert [(v.id, v.in_use) for v in sim.list_vnpus(0)] == [(100, False), (101, False)]
