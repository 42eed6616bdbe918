"""bench/dra.py's pure parts: the scheduler's histogram, the claims' steps,
the writes per pod by namespace and node, the ratios and the summary."""

from __future__ import annotations

from typing import Any

from bench.dra import (
    ClaimSteps,
    Histogram,
    binding_wait,
    claim_owner,
    claim_pod,
    claim_step_summaries,
    claim_template,
    devices_ready,
    histogram,
    markdown,
    namespace_writes,
    node_writes,
    ratios,
)
from bench.load import PodTimes

from vnpu_common.wire import names

NAME = "scheduler_dra_bindingconditions_wait_duration_seconds"


def metrics(success: tuple[float, float, float, float], timeout: int = 0) -> str:
    """Buckets 0.1, 3.2, 6.4, +Inf of the success series, then the sum and count."""
    b01, b32, b64, total = success
    lab = 'driver="vnpu.io",profile="default-scheduler",status="success"'
    lines = [
        "# HELP x y",
        f'{NAME}_bucket{{{lab},le="0.1"}} {b01}',
        f'{NAME}_bucket{{{lab},le="3.2"}} {b32}',
        f'{NAME}_bucket{{{lab},le="6.4"}} {b64}',
        f'{NAME}_bucket{{{lab},le="+Inf"}} {total}',
        f"{NAME}_sum{{{lab}}} {5.0 * total}",
        f"{NAME}_count{{{lab}}} {total}",
    ]
    if timeout:
        t = lab.replace("success", "timeout")
        lines += [
            f'{NAME}_bucket{{{t},le="6.4"}} 0',
            f'{NAME}_bucket{{{t},le="+Inf"}} {timeout}',
            f"{NAME}_sum{{{t}}} {600.0 * timeout}",
            f"{NAME}_count{{{t}}} {timeout}",
        ]
    lines.append("scheduler_dra_bindingconditions_allocations_total{} 3")
    return "\n".join(lines) + "\n"


def test_a_histogram_sums_its_label_sets_and_is_read_by_bucket() -> None:
    h = histogram(metrics((1, 1, 10, 10), timeout=2), NAME)
    assert h is not None
    assert h.count == 12
    assert h.buckets[6.4] == 10
    assert h.buckets[float("inf")] == 12
    # The p50 lies in the 6.4 s bucket; the p99 past the last finite bound.
    assert h.quantile(50) == 6.4
    assert h.quantile(99) is None
    only = histogram(metrics((1, 1, 10, 10), timeout=2), NAME, 'status="success"')
    assert only is not None
    assert only.count == 10
    assert only.quantile(99) == 6.4
    assert histogram("", NAME) is None
    assert Histogram().quantile(50) is None


def test_the_profile_label_is_not_read_as_a_bucket_bound() -> None:
    # `profile="default-scheduler"` holds `le="`: only a label named le is a bound.
    h = histogram(metrics((0, 0, 1, 1)), NAME)
    assert h is not None
    assert set(h.buckets) == {0.1, 3.2, 6.4, float("inf")}


def test_the_binding_wait_is_what_the_churn_added() -> None:
    out = binding_wait(metrics((1, 1, 2, 2)), metrics((1, 1, 12, 12)))
    assert out["metric"] == NAME
    assert out["count"] == 10
    assert out["mean"] == 5.0
    assert out["p50_at_most"] == 6.4
    assert out["success"]["count"] == 10
    assert "timeout" not in out
    assert NAME in out["served"]
    assert "scheduler_dra_bindingconditions_allocations_total" in out["served"]
    assert binding_wait("", "")["metric"] is None


def test_a_claims_pod_and_readiness_come_from_its_owner_and_every_device() -> None:
    claim: dict[str, Any] = {
        "metadata": {"ownerReferences": [{"kind": "Pod", "name": "d-00001"}]},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"pool": "dn-0000", "device": "a"},
                        {"pool": "dn-0000", "device": "b"},
                    ]
                }
            },
            "devices": [
                {
                    "pool": "dn-0000",
                    "device": "a",
                    "conditions": [{"type": names.DRA_COND_READY, "status": "True"}],
                }
            ],
        },
    }
    assert claim_owner(claim) == "d-00001"
    assert claim_owner({"metadata": {}}) is None
    assert not devices_ready(claim)
    claim["status"]["devices"].append(
        {
            "pool": "dn-0000",
            "device": "b",
            "conditions": [{"type": names.DRA_COND_READY, "status": "True"}],
        }
    )
    assert devices_ready(claim)
    assert not devices_ready({"status": {}})


def test_claim_steps_chain_from_creation_to_running() -> None:
    p = PodTimes("d-0", "vir05_1c_16g", 1, created=10.0, scheduled=15.1, running=15.2)
    never = PodTimes("d-1", "vir05_1c_16g", 1, created=11.0)
    out = claim_step_summaries([p, never], {"d-0": ClaimSteps(allocated=10.1, ready=10.2)})
    assert out["created_to_allocated"]["n"] == 1
    assert abs(out["created_to_allocated"]["p50"] - 0.1) < 1e-9
    assert abs(out["ready_to_bound"]["p99"] - 4.9) < 1e-9
    assert abs(out["allocated_to_bound"]["p50"] - 5.0) < 1e-9
    assert abs(out["bound_to_running"]["p50"] - 0.1) < 1e-9


def audit(
    who: str, verb: str, resource: str, namespace: str = "", name: str = ""
) -> dict[str, Any]:
    ref = {"resource": resource, "namespace": namespace, "name": name}
    return {"userAgent": who, "verb": verb, "objectRef": {k: v for k, v in ref.items() if v}}


def test_writes_are_counted_per_pod_by_namespace_and_by_node() -> None:
    events = [
        audit("vnpu-bench/1", "create", "pods", "bench-dra"),
        audit("vnpu-operator/1", "create", "vnpuallocations", "bench-dra"),
        audit("vnpu-agent/1", "patch", "vnpuallocations", "bench-dra"),
        audit("kube-scheduler/v1.37.2", "patch", "pods", "bench-dra"),
        audit("vnpu-bench/1", "create", "pods", "bench"),
        audit("vnpu-agent/1", "patch", "vnpunodes", name="dn-0001"),
        audit("vnpu-agent/1", "update", "resourceslices", name="dn-0001-vnpu-devices-000"),
        audit("vnpu-agent/1", "patch", "vnpunodes", name="bn-0001"),
        audit("vnpu-agent/1", "update", "leases", "vnpu-system", name="dn-0001"),
    ]
    w = namespace_writes(events, "bench-dra", 2)
    assert w["per_pod"] == 2.0
    assert w["ours_per_pod"] == 1.0
    assert w["by_component"] == {"bench-driver": 0.5, "operator": 0.5, "agent": 0.5,
                                 "kube-scheduler": 0.5}  # fmt: skip
    assert w["by_write"]["operator: create vnpuallocations"] == 0.5
    assert node_writes(events, "dn-") == {"agent: patch vnpunodes": 1,
                                          "agent: update resourceslices": 1}  # fmt: skip
    assert node_writes(events, "bn-") == {"agent: patch vnpunodes": 1}


def kind(p50: float | None, p99: float | None) -> dict[str, Any]:
    return {"running": {"p50": p50, "p99": p99}}


def test_the_goal_is_claim_pods_within_one_and_a_half_times_plain_pods_at_p99() -> None:
    met = ratios({"claim": kind(1.0, 3.0), "annotation": kind(1.0, 2.0), "plain": kind(1.0, 2.0)})
    assert met["claim_p99"] == 1.5
    assert met["goal_met"]
    missed = ratios({"claim": kind(5, 5.1), "annotation": kind(0.1, 0.2), "plain": kind(0.1, 0.2)})
    assert not missed["goal_met"]
    none = ratios({"claim": kind(None, None), "annotation": kind(0.1, 0.2), "plain": kind(1, 1)})
    assert none["claim_p99"] is None
    assert not none["goal_met"]


def test_the_summary_names_every_kind_and_the_goal() -> None:
    def row(p99: float) -> dict[str, Any]:
        return {
            "running": {"p50": p99 / 2, "p99": p99}, "gone": {"p50": 0.01, "p99": 0.02},
            "admitted": 3, "asked": 3, "fill_rate": 1.0,
            "writes": {"per_pod": 7.0, "ours_per_pod": 0.0},
        }  # fmt: skip

    kinds = {"claim": row(5.0), "annotation": row(0.2), "plain": row(0.1)}
    kinds["claim"]["agent_cpu_ms_per_pod"] = 12.0
    kinds["claim"]["writes_per_pod_with_nodes"] = 21.5
    r = {
        "config": {"nodes": 20, "pods": 3, "rate": 3.0, "hold": 20.0},
        "machine": {"cpus_usable": 2, "model": "Intel(R) Xeon(R)"},
        "runtime_s": 300.0,
        "kinds": kinds,
        "ratios": ratios(kinds),
        "cpu": {"ms_per_pod_any_kind_over_idle": {"kube-apiserver": 50.0},
                "operator_ms_per_vnpu_pod_over_idle": 10.0, "machine": {"busy": 0.7}},
        "binding_conditions": {"metric": None, "served": []},
        "correctness": {"claim_pods_not_gone": 0},
    }  # fmt: skip
    text = markdown(r)
    assert "| created -> running p50 / p99 | 2.500 s / 5.000 s |" in text
    assert "50.00x" in text
    assert "NOT met" in text
    assert "12.0 ms" in text
    assert "21.50" in text
    assert "all 0" in text


def test_claim_pods_ask_by_template_with_cel() -> None:
    t = claim_template("bench-dra", "vir05_1c_16g", 2)
    assert t["metadata"]["name"] == "vir05-1c-16g-x2"
    req = t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert req["count"] == 2
    assert '== "vir05_1c_16g"' in req["selectors"][0]["cel"]["expression"]
    pod = claim_pod("d-0", "bench-dra", "vir05_1c_16g", 2)
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "vir05-1c-16g-x2"
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "npu"}]
