"""The benchmark's pure figures: percentiles, admission-call counts, ours minus baseline."""

from __future__ import annotations

from typing import Any

from bench.floors import compare, per_event
from bench.report import (
    agents_total,
    burst_cpu_rows,
    pct,
    release_write_rows,
    saturation_hint,
    summary,
    webhook_calls_in,
)
from bench.run import over_idle


def test_percentiles_are_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]  # 1..100
    assert pct(values, 50) == 50
    assert pct(values, 99) == 99
    assert pct(values, 100) == 100
    assert pct([3.0, 1.0, 2.0], 50) == 2
    assert pct([], 99) is None
    s = summary([5.0, 1.0], (50,))
    assert s == {"n": 2, "p50": 1.0, "max": 5.0}


def test_webhook_calls_by_name_and_operation() -> None:
    text = "\n".join([
        "# HELP apiserver_admission_webhook_request_total ...",
        'apiserver_admission_webhook_request_total{code="200",name="m.vnpu.io",'
        'operation="CREATE",rejected="false",type="admit"} 7',
        'apiserver_admission_webhook_request_total{code="400",name="m.vnpu.io",'
        'operation="CREATE",rejected="true",type="admit"} 1',
        'apiserver_admission_webhook_request_total{code="200",name="v.vnpu.io",'
        'operation="UPDATE",rejected="false",type="validating"} 3',
        'apiserver_request_total{code="200",verb="GET"} 99',
    ])  # fmt: skip
    assert webhook_calls_in(text) == {"m.vnpu.io CREATE": 8, "v.vnpu.io UPDATE": 3}


def test_ours_minus_baseline() -> None:
    ours = {"running": {"p50": 0.5, "p99": 2.0}, "gone": {"p50": 0.3, "p99": None},
            "cpu_ms_per_pod": {"kube-apiserver": 30.0, "vnpu-operator": 20.0}}  # fmt: skip
    base = {"running": {"p50": 0.1, "p99": 0.5}, "gone": {"p50": 0.1, "p99": 0.2},
            "cpu_ms_per_pod": {"kube-apiserver": 10.0, "etcd": 2.0}}  # fmt: skip
    d = compare(ours, base)
    assert d["running"]["p50"] == 0.4
    assert d["running"]["p99"] == 1.5
    assert d["gone"]["p99"] is None
    assert d["scheduled"] == {"p50": None, "p99": None}
    assert d["cpu_ms_per_pod"] == {"etcd": -2.0, "kube-apiserver": 20.0, "vnpu-operator": 20.0}


def test_cpu_per_event_in_milliseconds() -> None:
    assert per_event(2.0, 1000) == 2.0
    assert per_event(1.0, 0) is None
    assert per_event(None, 10) is None


def test_cpu_per_pod_with_the_idle_rate_taken_out() -> None:
    # 100 pods over a 20 s window; the agent burns 0.1 s/s idle (Leases,
    # resyncs): 2 of its 5 s are not the pods'. Never below zero.
    churn = {"vnpu-agent-0": 5.0, "vnpu-operator": 1.2, "etcd": 0.5}
    idle = {"vnpu-agent-0": 0.1, "vnpu-operator": 0.01, "etcd": 0.5}
    lean = over_idle(churn, idle, 20.0, 100)
    assert lean["vnpu-agent-0"] == 30.0
    assert abs(lean["vnpu-operator"] - 10.0) < 1e-9
    assert lean["etcd"] == 0.0


def test_agent_processes_are_summed_by_their_name() -> None:
    per_process = {"vnpu-agent-0": 1.5, "vnpu-agent-3": 2.0, "vnpu-operator": 9.0, "etcd": 4.0}
    assert agents_total(per_process) == 3.5
    assert agents_total({"vnpu-operator": 1.0}) == 0


def _stuck_run(cpu_s: float, floor_p99: float | None, stuck: int = 5) -> dict[str, Any]:
    floor = {"churn": {"ungate": {"p99": floor_p99}}} if floor_p99 is not None else None
    return {
        "correctness": {"churn_pods_stuck_gated": stuck},
        "churn": {"duration_s": 100.0, "cpu_seconds": {"kube-apiserver": cpu_s * 0.8,
                                                       "vnpu-operator": cpu_s * 0.2}},
        "floor": floor,
    }  # fmt: skip


def test_saturation_hint_names_busy_cores_and_a_slow_floor() -> None:
    hint = saturation_hint(_stuck_run(197.0, 31.0), cores=2, stuck_seconds=30)
    assert hint is not None
    assert "1.97 of 2 cores busy" in hint
    assert "floor's own created -> ungated p99 was 31.0s" in hint
    only_floor = saturation_hint(_stuck_run(50.0, 31.0), cores=16, stuck_seconds=30)
    assert only_floor is not None
    assert "cores busy" not in only_floor


def test_no_saturation_hint_on_an_idle_machine_or_without_stuck_pods() -> None:
    # Stuck pods on a machine with room to spare are a bug to look at, not load.
    assert saturation_hint(_stuck_run(100.0, 0.5), cores=2, stuck_seconds=30) is None
    assert saturation_hint(_stuck_run(100.0, None), cores=2, stuck_seconds=30) is None
    assert saturation_hint(_stuck_run(197.0, 31.0, stuck=0), cores=2, stuck_seconds=30) is None


def test_burst_cpu_rows_give_cores_busy_and_ms_per_pod_largest_first() -> None:
    ours = {"vnpu-operator": 2.0, "kube-apiserver": 12.0}
    floor = {"kube-apiserver": 6.0, "bench-driver": 1.5}
    burst = {
        "pods": 100,
        "cpu": {
            "ours": {"window_s": 10.0, "cpu_seconds": ours},
            "floor": {"window_s": 5.0, "cpu_seconds": floor},
        },
    }
    rows = dict(burst_cpu_rows(burst))
    assert rows["  burst cores busy, ours / floor"] == "1.40 / 1.50"
    assert rows["    kube-apiserver"] == "120.0 / 60.0"
    # A process the floor did not run has no floor figure.
    assert rows["    vnpu-operator"] == "20.0 / -"
    names = [label for label, _ in burst_cpu_rows(burst)][2:]
    assert names == ["    kube-apiserver", "    vnpu-operator"]


def test_burst_cpu_rows_without_floor_or_figures() -> None:
    ours = {"window_s": 2.0, "cpu_seconds": {"kube-apiserver": 1.0}}
    rows = dict(burst_cpu_rows({"pods": 10, "cpu": {"ours": ours, "floor": None}}))
    assert rows["  burst cores busy, ours / floor"] == "0.50 / -"
    assert rows["    kube-apiserver"] == "100.0 / -"
    # Results written before the burst's CPU was measured print nothing.
    assert burst_cpu_rows({"pods": 10, "ours_pods_per_s": 3.0}) == []
    assert burst_cpu_rows({"pods": 0, "cpu": {"ours": ours}}) == []


def test_release_writes_busiest_component_first_with_its_commonest_writes() -> None:
    rows = release_write_rows(
        {
            "operator": {"create vnpuallocations": 400, "delete vnpuallocations": 400},
            "agent": {
                "patch vnpunodes/status": 180,
                "patch vnpuallocations": 400,
                "patch vnpuallocations/status": 400,
                "patch leases": 300,
                "create events": 2,
                "patch nodes": 1,
            },
        }
    )
    assert [label for label, _ in rows] == [
        "  release's writes: agent",
        "  release's writes: operator",
    ]
    # Six kinds of agent writes: the five commonest shown, the total of all.
    assert rows[0][1] == (
        "1283  patch vnpuallocations 400, patch vnpuallocations/status 400, "
        "patch leases 300, patch vnpunodes/status 180, create events 2"
    )
    assert rows[1][1] == "800  create vnpuallocations 400, delete vnpuallocations 400"
    assert release_write_rows({}) == []
