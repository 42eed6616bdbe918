"""The per-step attribution of a pod's latency and the periodic work that
overlaps the slowest pods (bench/steps.py, bench/timeline.py)."""

from __future__ import annotations

from typing import Any, cast

from bench.allocclock import AllocationClock
from bench.load import PodTimes, steps
from bench.steps import CREATE, DELETE, attribute, raw, slowest
from bench.timeline import (
    BURST_LEAST,
    KWOK_BURST,
    SETTLED,
    Work,
    audit_kind,
    covered,
    from_audit,
    from_pause_lines,
    overlaps,
)
from kubernetes_asyncio import client

from vnpu_common.wire import names


class Lister:
    def list_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("not called: no watch is started")


def alloc(name: str, uid: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta}, "spec": {"podUID": uid}}


def ready(name: str, uid: str) -> dict[str, Any]:
    return {**alloc(name, uid), "status": {"phase": names.PHASE_READY}}


def placed(
    uid: str, at: float, allocs_at: float, ready_at: float, ungated: float
) -> tuple[PodTimes, AllocationClock]:
    clock = AllocationClock(cast(client.CustomObjectsApi, Lister()), "bench")
    pod = PodTimes("p", "vir01", 1, created=at, uid=uid, ungated=ungated, seen=at + 0.001)
    clock.stamp("ADDED", alloc("a", uid), allocs_at)
    clock.stamp("MODIFIED", ready("a", uid), ready_at)
    return pod, clock


def test_the_steps_add_up_to_the_latency_and_the_longest_holds() -> None:
    pod, clock = placed("u", 10.0, 10.1, 10.5, 10.6)
    s = CREATE.steps(pod, clock)
    assert s is not None
    assert abs(sum(s) - 0.6) < 1e-9
    assert max(range(len(s)), key=s.__getitem__) == 2  # the agent's vNPU create


def test_a_point_out_of_order_counts_no_time_and_the_next_step_holds_it() -> None:
    # The allocation watch delivered Ready after the pod watch showed it ungated.
    pod, clock = placed("u", 10.0, 10.1, 10.9, 10.6)
    s = CREATE.steps(pod, clock)
    assert s is not None
    assert abs(sum(s) - 0.6) < 1e-9
    assert s[2] == 0.0 or abs(s[2] - 0.5) < 1e-9
    assert all(x >= 0 for x in s)


def test_a_pod_without_its_last_point_is_left_out() -> None:
    pod, clock = placed("u", 10.0, 10.1, 10.5, 10.6)
    pod.ungated = None
    assert CREATE.times(pod, clock) is None


def test_pod_events_stamp_the_release_steps() -> None:
    pod = PodTimes("p", "vir01", 1)
    live = {"metadata": {"name": "p", "finalizers": [names.POD_FINALIZER]},
            "spec": {"nodeName": "n"}}  # fmt: skip
    steps(pod, live, 1.0)
    meta = {"name": "p", "deletionTimestamp": "x", "finalizers": [names.POD_FINALIZER]}
    deleting = {"metadata": meta, "spec": {"nodeName": "n"}}
    steps(pod, deleting, 2.0)
    assert (pod.seen, pod.terminating, pod.stopped) == (1.0, 2.0, None)
    stopped = {**deleting, "status": {"phase": "Succeeded"}}
    steps(pod, stopped, 3.0)
    steps(pod, {**stopped, "metadata": {"name": "p", "deletionTimestamp": "x"}}, 4.0)
    assert (pod.stopped, pod.unfinalized) == (3.0, 4.0)


def test_release_chain_from_allocation_events() -> None:
    clock = AllocationClock(cast(client.CustomObjectsApi, Lister()), "bench")
    clock.stamp("ADDED", alloc("a", "u"), 1.0)
    clock.stamp("MODIFIED", alloc("a", "u", deletionTimestamp="2026-01-01T00:00:00Z"), 5.2)
    clock.stamp("DELETED", alloc("a", "u", deletionTimestamp="2026-01-01T00:00:00Z"), 5.5)
    pod = PodTimes("p", "vir01", 1, uid="u", delete_called=5.0, terminating=5.01, stopped=5.1,
                   gone=5.7)  # fmt: skip
    s = DELETE.steps(pod, clock)
    assert s is not None
    assert [round(x, 2) for x in s] == [0.01, 0.09, 0.1, 0.3, 0.0, 0.2]
    assert clock.fallbacks == 0


def test_the_slowest_are_the_slowest_one_percent() -> None:
    lat = {f"p{i}": float(i) for i in range(200)}
    assert slowest(lat) == ["p199", "p198"]
    assert slowest({"a": 1.0}) == ["a"]
    assert slowest({}) == []


def test_attribution_names_the_step_that_held_the_slow_pods() -> None:
    pods, clocks = [], []
    for i in range(100):
        slow = 0.5 if i == 99 else 0.0
        pod, clock = placed(f"u{i}", 10.0, 10.01 + slow, 10.02 + slow, 10.03 + slow)
        pod.name = f"p{i}"
        pods.append(pod)
        clocks.append(clock)
    merged = clocks[0]
    for c in clocks[1:]:
        merged.created.update(c.created)
        merged.ready.update(c.ready)
    a = attribute(CREATE, pods, merged)
    assert a["slowest"]["names"] == ["p99"]
    held = {s["step"]: s["held_slowest"] for s in a["steps"]}
    assert held["allocations created (operator: place)"] == 1
    assert a["worst"]["pod"] == "p99"


def test_coverage_of_a_window_by_merged_spans() -> None:
    merged = [(1.0, 2.0), (3.0, 4.0)]
    assert covered(merged, 1.5, 3.5) == 1.0
    assert covered(merged, 2.1, 2.9) is None
    assert covered(merged, 4.0, 5.0) == 0.0  # touching counts as overlapping


def test_overlaps_compare_slow_pods_with_all() -> None:
    windows = {f"p{i}": (float(i), i + 0.5) for i in range(10)}
    work = [Work("gc", 9.1, 9.2), Work("lease", 0.0, 10.0)]
    r = overlaps(work, windows, ["p9"])
    kinds = {k["kind"]: k for k in r["kinds"]}
    assert kinds["gc"]["slow_share"] == 1.0
    assert kinds["gc"]["all_share"] == 0.1
    assert kinds["lease"]["lift"] == 1.0
    assert r["kinds"][0]["kind"] == "gc"
    assert r["pods"]["p9"]["gc"] == 100.0


def test_pause_lines_and_audit_kinds() -> None:
    lines = [
        "2026 INFO vnpu_common.process.pauses pause kind=loop start=100.0 ms=50.0 cpu_ms=48.0",
        "pause kind=loop start=101.0 ms=50.0 cpu_ms=1.0",
        "pause kind=gc start=102.0 ms=20.0 gen=2 collected=5",
        "unrelated",
    ]
    w = from_pause_lines("operator", lines, offset=100.0)
    assert [x.kind for x in w] == [
        "operator: loop busy", "operator: loop not scheduled", "operator: GC generation 2"
    ]  # fmt: skip
    assert (w[2].start, round(w[2].end, 3)) == (2.0, 2.02)
    ev = {"userAgent": names.USER_AGENT_OPERATOR + "/1", "verb": "list",
          "objectRef": {"resource": "pods"}}  # fmt: skip
    assert audit_kind(ev) == "operator: convergence pass (lists)"
    ev = {"userAgent": names.USER_AGENT_AGENT + "/1", "verb": "patch",
          "objectRef": {"resource": names.NODE_PLURAL, "subresource": "status"}}  # fmt: skip
    assert audit_kind(ev) == "agents: VNPUNode write"
    assert audit_kind({"userAgent": "kube-scheduler/1", "verb": "list"}) is None


def test_a_vnpunode_write_the_settle_interval_put_off_is_told_apart() -> None:
    def write(node: str, second: int) -> dict[str, Any]:
        at = f"2026-01-01T00:00:{second:02d}.000000Z"
        return {"userAgent": names.USER_AGENT_AGENT + "/1", "verb": "patch",
                "objectRef": {"resource": names.NODE_PLURAL, "name": node,
                              "subresource": "status"},
                "requestReceivedTimestamp": at, "stageTimestamp": at}  # fmt: skip

    events = [write("a", 1), write("b", 2), write("a", 31), write("b", 10)]
    kinds = [w.kind for w in from_audit(events, offset=0.0, settle=30.0)]
    assert kinds == ["agents: VNPUNode write"] * 2 + ["agents: VNPUNode write"] + [SETTLED]


def test_kwok_node_lease_renewals_count_only_where_they_come_in_a_burst() -> None:
    def renewal(at: float, agent: str = "kwok/v0.7.0 (linux/amd64)") -> dict[str, Any]:
        stamp = f"2026-01-01T00:00:{at:09.6f}Z"
        return {"userAgent": agent, "verb": "update",
                "objectRef": {"resource": "leases", "namespace": "kube-node-lease"},
                "requestReceivedTimestamp": stamp, "stageTimestamp": stamp}  # fmt: skip

    # 30 Leases in 1.5 s from 10 s, then 5 spread from 20 s: one burst.
    burst = [renewal(10 + 0.05 * i) for i in range(30)]
    spread = [renewal(20.0 + 2 * i) for i in range(5)]
    # The same pace from someone else's client is not kwok's.
    other = [renewal(40 + 0.05 * i, agent="kubelet/v1.34") for i in range(BURST_LEAST)]
    epoch0 = 1767225600.0  # 2026-01-01T00:00:00Z
    work = [w for w in from_audit(burst + spread + other, offset=epoch0) if w.kind == KWOK_BURST]
    assert [(round(w.start, 2), round(w.end, 2)) for w in work] == [(10.0, 11.45)]
    # One write short of a burst is none.
    short = from_audit(burst[: BURST_LEAST - 1], offset=epoch0)
    assert [w for w in short if w.kind == KWOK_BURST] == []


def test_the_raw_timeline_counts_from_the_first_creation() -> None:
    pod, clock = placed("u", 10.0, 10.1, 10.5, 10.6)
    r = raw([pod], clock, [Work("gc", 11.0, 11.5)])
    assert r["pods"]["p"]["created"] == 0.0
    assert r["pods"]["p"]["ungated"] == 0.6
    assert r["pods"]["p"]["allocations"]["ready"] == {"a": 0.5}
    assert r["work"] == [["gc", 1.0, 1.5]]
