"""bench/shared.py's pure parts: the sizes, the ordinary churn's steps and
pacing, the ordinary events counted, the per-window and per-event
arithmetic, the final counts with live pods, the table and the JSON."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from bench import shared
from bench.load import PodTimes
from bench.shared import (
    CountingTracker,
    OrdinaryDriver,
    Recycler,
    create_until_admitted,
    election,
    final_counts,
    ordinary_churn,
    parse,
    per_ordinary_event,
    table,
    window_figures,
)
from bench.watchcount import Tally, WatchSpec
from bench_helpers import bare_tracker

from vnpu_agent.drivers.sim.state import SimChip, SimState, SimVnpu
from vnpu_common.wire import names


def test_the_default_size_fits_two_cores_at_the_issues_one_to_two() -> None:
    a = parse([])
    assert (a.nodes, a.live, a.ordinary) == (200, 2000, 4000)
    assert a.ordinary == 2 * a.live
    assert a.ordinary_nodes == 20  # 200 ordinary pods per node of 250 slots
    assert a.agents == 1  # 250 nodes per agent process, as bench.scale
    assert a.timeout == 600.0
    assert a.workdir is None
    assert not a.keep


def test_large_sets_every_size_an_option_does_not_give() -> None:
    a = parse(["--large", "--live", "500", "--ordinary", "1001"])
    assert (a.nodes, a.live, a.ordinary) == (1000, 500, 1001)
    assert a.agents == 4
    assert a.ordinary_nodes == 6  # ceil(1001 / 200)
    assert a.churn_pods == shared.SIZES["large"].churn_pods
    assert a.rate == shared.SIZES["large"].rate
    b = parse(["--nodes", "600", "--nodes-per-agent", "100", "--ordinary-nodes", "3"])
    assert (b.agents, b.ordinary_nodes, b.live) == (6, 3, 2000)


def test_keep_without_a_workdir_keeps_a_fresh_directory() -> None:
    a = parse(["--keep"])
    try:
        assert isinstance(a.workdir, Path)
        assert a.workdir.is_dir()
        assert not any(a.workdir.iterdir())
    finally:
        shutil.rmtree(a.workdir, ignore_errors=True)
    assert parse(["--keep", "--workdir", "/tmp/x-shared"]).workdir == Path("/tmp/x-shared")


def test_ordinary_pods_ask_for_no_vnpu_and_select_the_ordinary_nodes() -> None:
    d = OrdinaryDriver.__new__(OrdinaryDriver)
    d.namespace = shared.ORDINARY_NS
    pod = d.manifest("o-1", "vir05_1c_16g", 2)
    assert names.ANN_TEMPLATE not in (pod["metadata"].get("annotations") or {})
    assert pod["spec"]["nodeSelector"] == {shared.POOL_LABEL: shared.POOL_ORDINARY}
    assert pod["metadata"]["labels"] == {"app": shared.ORDINARY_APP}
    assert pod["metadata"]["namespace"] == shared.ORDINARY_NS


def counting_tracker() -> CountingTracker:
    t = bare_tracker("none")
    t.__class__ = CountingTracker
    assert isinstance(t, CountingTracker)
    t.events = shared.Counter()
    return t


def test_the_ordinary_watch_counts_every_event_but_a_relists_sync() -> None:
    t = counting_tracker()
    pod = PodTimes("o-1", "", 0, created=1.0)
    t.add(pod)
    body = {"metadata": {"name": "o-1"}, "spec": {"nodeName": "on-0"},
            "status": {"phase": "Running"}}  # fmt: skip
    t.stamp("ADDED", {"metadata": {"name": "o-1"}, "spec": {}}, 1.1)
    t.stamp("MODIFIED", body, 1.2)
    t.stamp("SYNC", body, 1.3)
    t.stamp("DELETED", body, 2.0)
    assert t.events == {"ADDED": 1, "MODIFIED": 1, "DELETED": 1}
    assert pod.running == 1.2  # still the tracker's stamps
    assert pod.gone == 2.0


def test_each_step_deletes_the_oldest_and_keeps_the_count() -> None:
    first = [PodTimes(f"o-{i}", "", 0) for i in range(3)]
    r = Recycler(deque(first), "rb")
    steps = [r.step() for _ in range(4)]
    assert [old.name for old, _ in steps] == ["o-0", "o-1", "o-2", "rb-000000"]
    assert [new.name for _, new in steps] == [f"rb-{i:06d}" for i in range(4)]
    assert len(r.live) == 3
    assert r.deleted == [old for old, _ in steps]
    assert r.created == [new for _, new in steps]
    assert len({p.name for p in r.created}) == 4


class FakeDriver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any) -> None:
        self.tasks.add(asyncio.ensure_future(coro))

    async def delete(self, pod: PodTimes) -> None:
        self.calls.append(("delete", pod.name, asyncio.get_running_loop().time()))

    async def create(self, pod: PodTimes) -> None:
        self.calls.append(("create", pod.name, asyncio.get_running_loop().time()))

    async def drain(self) -> None:
        await asyncio.gather(*self.tasks)


async def test_the_ordinary_churn_replaces_at_its_rate_until_stopped() -> None:
    r = Recycler(deque(PodTimes(f"o-{i}", "", 0) for i in range(100)), "rb")
    d: Any = FakeDriver()
    stop = asyncio.Event()
    task = asyncio.create_task(ordinary_churn(d, r, 50.0, stop))
    await asyncio.sleep(0.5)
    stop.set()
    await task
    # About 25 steps in half a second at 50/s (one at once); a loaded machine runs late.
    assert 10 <= len(r.created) <= 27
    deletes = [n for k, n, _ in d.calls if k == "delete"]
    creates = [n for k, n, _ in d.calls if k == "create"]
    assert deletes == [p.name for p in r.deleted]
    assert creates == [p.name for p in r.created]
    times = [t for k, _, t in d.calls if k == "create"]
    assert times[-1] - times[0] >= (len(times) - 1) / 50.0 - 0.02
    n = len(r.created)
    await asyncio.sleep(0.1)
    assert len(r.created) == n  # stopped means no step after


def test_per_ordinary_event_is_b_minus_a_over_bs_ordinary_events() -> None:
    a = {"vnpu-operator": 2.0, "vnpu-agent-0": 1.0, "vnpu-agent-1": 1.0, "kube-apiserver": 10.0}
    b = {"vnpu-operator": 2.5, "vnpu-agent-0": 1.5, "vnpu-agent-1": 1.0, "kube-apiserver": 16.0,
         "kube-scheduler": 1.0}  # fmt: skip
    got = per_ordinary_event(a, b, 1000)
    assert got["operator"] == pytest.approx(0.5)
    assert got["agents"] == pytest.approx(0.5)
    assert got["kube-apiserver"] == pytest.approx(6.0)
    assert got["all_processes"] == pytest.approx(8.0)
    assert set(per_ordinary_event(a, b, 0).values()) == {None}
    # The operator may cost less in B (noise): the figure says so, it is not clamped.
    assert per_ordinary_event(b, a, 100)["operator"] == pytest.approx(-5.0)


def churned(i: int, created: bool = True) -> PodTimes:
    p = PodTimes(f"c-{i}", "vir01", 1)
    if created:
        p.created, p.ungated, p.running = 10.0 * i, 10.0 * i + 0.1 * (i + 1), 10.0 * i + 1
        p.delete_called, p.gone = 10.0 * i + 5, 10.0 * i + 5.5
    return p


def test_a_windows_cpu_per_vnpu_pod_counts_the_pods_created() -> None:
    pods = [churned(i) for i in range(4)] + [churned(9, created=False)]
    spent = {"window_s": 8.0, "machine": {"busy": 0.5},
             "cpu_seconds": {"vnpu-operator": 0.4, "vnpu-agent-0": 0.2, "vnpu-agent-1": 0.2,
                             "kube-apiserver": 4.0}}  # fmt: skip
    got = window_figures(spent, pods, {"operator": {"events": 3}})
    assert got["churn_pods"] == 5
    assert got["cpu_ms_per_vnpu_pod"] == pytest.approx(
        {"operator": 100.0, "agents": 100.0, "kube-apiserver": 1000.0}
    )
    assert got["apiserver_cores"] == pytest.approx(0.5)
    assert got["ungate"]["n"] == 4
    assert got["ungate"]["p50"] == pytest.approx(0.2)
    assert got["ungate"]["p99"] == pytest.approx(0.4)
    assert got["gone"]["p99"] == pytest.approx(0.5)
    assert got["running"]["max"] == pytest.approx(1.0)
    assert got["watch"] == {"operator": {"events": 3}}


def test_window_watch_totals_are_per_component_not_per_pod() -> None:
    tallies = [
        (WatchSpec("operator", "pods", "x"), Tally(events=10, nbytes=1000)),
        (WatchSpec("agent", names.ALLOCATION_PLURAL, "y"), Tally(events=4, nbytes=40)),
        (WatchSpec("agent", names.ALLOCATION_PLURAL, "z"), Tally(events=6, nbytes=60)),
    ]
    got = shared.watch_totals(tallies)
    assert got["operator"]["events"] == 10
    assert got["agent"]["bytes"] == 100
    assert got["agent"]["by_kind"][names.ALLOCATION_PLURAL]["events"] == 10


def chips(*models: str) -> list[SimChip]:
    return [
        SimChip(index=i, model=m, physical_id=i, card_id=i, device_id=0)
        for i, m in enumerate(models)
    ]


def alloc(node: str, vnpu_id: int, uid: str) -> dict[str, Any]:
    return {"spec": {"nodeName": node, "chip": 0, "vnpuId": vnpu_id, "template": "vir05_1c_16g",
                     "podUID": uid}}  # fmt: skip


def test_final_counts_leave_the_live_pods_allocations_out_of_the_leftovers() -> None:
    allocs = [alloc("n-0", 100, "live-1"), alloc("n-0", 101, "gone-1"),
              alloc("elsewhere", 100, "gone-2")]  # fmt: skip
    sims = {
        "n-0": SimState(
            chips=chips("910B3"),
            vnpus={v: SimVnpu(v, 0, "vir05_1c_16g") for v in (100, 101, 102)},
        )
    }
    got = final_counts(allocs, sims, ["n-0"], {"live-1"})
    assert got["leftover_allocations"] == 1  # gone-1's; not live-1's, not another node's
    assert got["leaked_vnpus"] == 1  # 102: no allocation names it
    assert got["double_booked_ids"] == 0
    assert final_counts(allocs[:1], sims, ["n-0"], {"live-1"})["leftover_allocations"] == 0


def test_the_failover_runs_with_the_products_election_settings() -> None:
    from vnpu_operator.config import OperatorSettings

    s = OperatorSettings()
    assert election() == {
        "lease_s": s.leader_election_lease_seconds,
        "renew_deadline_s": s.leader_election_renew_deadline_seconds,
        "retry_s": s.leader_election_retry_seconds,
    }


def results() -> dict[str, Any]:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(parse([])).items()}

    def window(op_ms: float, apiserver_s: float, pod_events: int) -> dict[str, Any]:
        return {
            "window_s": 81.0, "machine": {"busy": 0.7},
            "cpu_ms_per_vnpu_pod": {"operator": op_ms, "agents": 20.0, "kube-apiserver": 90.0},
            "apiserver_cpu_s": apiserver_s, "apiserver_cores": apiserver_s / 81.0,
            "ungate": {"p50": 0.05, "p99": 0.35}, "running": {"p50": 0.07, "p99": 0.5},
            "gone": {"p50": 0.1, "p99": 0.9},
            "watch": {
                "operator": {"events": 3000.0, "bytes": 4.5e6,
                             "by_kind": {"pods": {"events": pod_events, "bytes": 2e6}}},
                "agent": {"events": 1500.0, "bytes": 1e6},
            },
        }  # fmt: skip

    a, b = window(16.0, 20.0, 1200), window(17.0, 40.0, 1201)
    a["ordinary_events"], b["ordinary_events"] = 0, 5600
    b["ordinary"] = {"replaced": 800, "events": 5600, "running": {"p50": 0.02, "p99": 0.25}}
    b["running_p99_over_plain"] = 2.0
    return {
        "config": config,
        "machine": {"cpus_usable": 2, "cpus": 2, "model": "x"},
        "fill": {"placed": 2000, "seconds": 118.0, "pods_per_s": 16.9,
                 "ungate": {"p50": 1.0, "p99": 3.0}},
        "ordinary": {"running": 4000, "seconds": 80.0, "pods_per_s": 50.0,
                     "running_latency": {"p50": 0.5, "p99": 1.5}},
        "operator_rss_mb": {"synced": 90.0, "after_fill": 120.0, "after_ordinary": 121.0},
        "windows": {"a": a, "b": b},
        "per_ordinary_event": per_ordinary_event(
            {"vnpu-operator": 3.84}, {"vnpu-operator": 4.40}, 5600
        ),
        "processes": {"vnpu-operator": {"peak_rss_mb": 130.0, "rss_mb": 125.0},
                      "vnpu-agent-0": {"peak_rss_mb": 150.0, "rss_mb": 140.0}},
        "cold_start": {"stop_s": 0.8, "start_to_ready_s": 4.2, "ready_to_placed_s": 0.1,
                       "start_to_placed_s": 4.3, "rss_ready_mb": 115.0, "rss_placed_mb": 116.0},
        "failover": {"election": election(), "kill_to_takeover_s": 3.1,
                     "kill_to_next_placement_s": 3.6, "refused": 0, "attempts": 76},
        "correctness": {"final_double_booked_ids": 0, "final_leaked_vnpus": 0},
        "runtime_s": 700.0,
    }  # fmt: skip


def test_the_table_shows_each_window_side_by_side_and_the_per_event_figure() -> None:
    lines = table(results())
    text = "\n".join(lines)
    assert lines[0].startswith("=== vnpu-operator shared cluster: 200 vNPU nodes")
    row = next(x for x in lines if x.strip().startswith("operator CPU per vNPU pod"))
    assert "16.00 ms" in row
    assert "17.00 ms" in row
    assert row.index("16.00 ms") < row.index("17.00 ms")  # A, then B
    floor = next(x for x in lines if "floor: plain created -> Running" in x)
    assert "0.020s / 0.250s" in floor
    per = next(x for x in lines[lines.index(next(x for x in lines if "per ordinary-pod" in x)):]
               if x.strip().startswith("operator"))  # fmt: skip
    assert "0.10 ms" in per  # (4.40 - 3.84) s over 5600 events
    pods = next(x for x in lines if "of which the operator's pod watch" in x)
    assert "1200 / 2.00" in pods
    assert "1201 / 2.00" in pods
    events = next(x for x in lines if x.strip().startswith("ordinary pod events"))
    assert events.split()[-2:] == ["0", "5600"]
    assert next(x for x in lines if "ordinary pods replaced" in x).split()[-1] == "800"
    assert "4.200s" in text
    assert "3.600s" in text
    assert "final_leaked_vnpus" in text
    assert "lease 4s" in text


def test_the_table_of_a_cut_short_run_still_prints() -> None:
    r = {"config": results()["config"], "correctness": {"live_pods_not_placed": 3}}
    lines = table(r)
    assert any("live_pods_not_placed" in x and x.rstrip().endswith("3") for x in lines)


def test_the_results_are_json_with_every_option_in_the_config() -> None:
    r = results()
    back = json.loads(json.dumps(r))
    for option in ("nodes", "live", "ordinary", "ordinary_nodes", "churn_pods", "rate",
                   "ordinary_rate", "hold", "workdir", "out", "keep", "large", "agents",
                   "nodes_per_agent", "failover_rate", "concurrency", "timeout"):  # fmt: skip
        assert option in back["config"], option


class RefusingDriver:
    """Refuses the first `refusals` creates, as an API server whose webhook
    is not registered yet."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.errors: list[str] = ["an earlier error"]
        self.calls = 0

    async def create(self, pod: PodTimes) -> None:
        self.calls += 1
        if self.calls <= self.refusals:
            self.errors.append(f"create {pod.name}: 500 failed calling webhook")
            return
        pod.created = 1.0


async def test_the_probe_is_created_again_while_refused_and_the_refusals_are_counted() -> None:
    d: Any = RefusingDriver(2)
    pod = PodTimes("cold-0000", "vir05_1c_16g", 1)
    assert await create_until_admitted(d, pod, 10.0) == 2
    assert pod.created == 1.0
    assert d.calls == 3
    assert d.errors == ["an earlier error"]  # the refusals are counted, not errors


async def test_the_probe_gives_up_after_its_time_with_the_last_refusal_kept() -> None:
    d: Any = RefusingDriver(1000)
    pod = PodTimes("cold-0000", "vir05_1c_16g", 1)
    assert await create_until_admitted(d, pod, 0.3) == d.calls
    assert pod.created is None
    assert 2 <= d.calls <= 4
    assert d.errors[-1].startswith("create cold-0000")


async def test_a_polled_wait_says_whether_it_held_and_tells_its_progress() -> None:
    told: list[int] = []
    checks = iter([False, False, True])
    assert await shared.wait_polled(lambda: next(checks), 5.0, lambda: told.append(1),
                                    every=0.01, tell=0.0)  # fmt: skip
    assert told == [1, 1]
    t0 = asyncio.get_running_loop().time()
    assert not await shared.wait_polled(lambda: False, 0.1, every=0.02)
    assert asyncio.get_running_loop().time() - t0 >= 0.1
