"""The scaling run's per-size figures (bench/scale.py)."""

from __future__ import annotations

from typing import Any

from bench.scale import figures, held, size_args


def results(nodes: int) -> dict[str, Any]:
    return {
        "config": {"nodes": nodes, "agents": nodes // 250, "pods": 300, "rate": 5.0},
        "machine": {"cpus_usable": 8},
        "startup": {
            "nodes_ready_s": 1.0,
            "agents_to_all_vnpunodes_s": 2.0,
            "operator_ready_s": 3.0,
            "operator_rss_synced_mb": 100.0,
        },
        "processes": {
            "operator": {"peak_rss_mb": 200.0},
            "agents": {"peak_rss_mb": 500.0, "mb_per_node_over_base": 0.2},
        },
        "churn": {
            "ungate": {"p50": 0.02, "p99": 0.4},
            "gone": {"p50": 0.03, "p99": 0.5},
            "cpu_ms_per_pod_over_idle": {
                "vnpu-operator": 9.0,
                "vnpu-agent-0": 3.0,
                "vnpu-agent-1": 2.0,
                "kube-apiserver": 40.0,
            },
            "driver_ms_per_pod_over_idle": {"vnpu-agent-0": 1.0, "vnpu-agent-1": 1.0},
        },
        "idle": {
            "non_lease_writes": 0,
            "cpu_per_s": {"vnpu-operator": 0.05, "vnpu-agent-0": 0.25, "vnpu-agent-1": 0.25},
            "driver_cpu_per_s": {"vnpu-agent-0": 0.05, "vnpu-agent-1": 0.05},
        },
        "attribution": {
            "ungate": {
                "steps": [{"step": "a", "held_slowest": 1}, {"step": "b", "held_slowest": 2}]
            }
        },
        "correctness": {"leaked_vnpus": 0},
    }


def test_per_pod_cpu_splits_the_agents_own_code_from_the_simulated_driver() -> None:
    f = figures(results(500))
    assert f["cpu_ms_per_pod"]["operator"] == 9.0
    assert f["cpu_ms_per_pod"]["agents"] == 5.0
    assert f["cpu_ms_per_pod"]["agents_own_code"] == 3.0
    assert f["cpu_ms_per_pod"]["simulated_driver"] == 2.0
    assert f["idle_cpu_ms_per_s_per_node"]["agents"] == 1.0  # 500 ms/s over 500 nodes
    assert f["rss_mb_per_node"]["operator_synced"] == 0.2
    assert f["tail"] == {"ungate": "b"}
    assert held({"steps": []}) is None


def test_one_agent_process_per_250_nodes() -> None:
    class Opts:
        nodes_per_agent, pods, rate, hold, idle, timeout = 250, 300, 5.0, 10.0, 30.0, 600.0
        pauses_ms, attribution, workdir = 10.0, True, None

    argv = size_args(Opts(), 1000)  # type: ignore[arg-type]
    assert argv[argv.index("--agents") + 1] == "4"
    assert "--scale-only" in argv
