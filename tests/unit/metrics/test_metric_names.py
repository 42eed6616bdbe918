"""Every metric both components export follows the naming rules
(localplane.metric_rules): one quantity in one base unit per metric,
counters end in _total, info metrics in _info, pods and chips labelled so
they join with kube-state-metrics and npu-exporter. The registries are
filled with one of everything, so a new metric nobody exercised here fails
too. The rules themselves are shown to catch the names issue 16 replaced."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import promql_parser
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from localplane.metric_rules import STANDARD_FAMILIES, is_ours, violations
from vnpu_agent.drivers.base import VNPU, ChipInfo
from vnpu_agent.metrics import AgentMetrics
from vnpu_common import __version__
from vnpu_operator.metrics import OperatorMetrics, StateView, WaitingPod
from vnpu_operator.placement import ChipCapacity, Resources
from vnpu_operator.placement.fragmentation import Fragmentation

ROOT = Path(__file__).resolve().parents[3]
MIB = 1024 * 1024


def _capacity(**overrides: Any) -> ChipCapacity:
    fields: dict[str, Any] = {
        "node": "n1",
        "chip": 1,
        "physical_id": 5,
        "model": "910B3",
        "health": "Unhealthy",
        "cordoned": "maintenance",
        "total": Resources(20, 65536, 7),
        "used": Resources(5, 16384, 1),
        "free": Resources(15, 49152, 6),
        "allocated": 1,
        "orphans": 1,
        "vnpu_limit": 16,
    }
    return ChipCapacity(**{**fields, **overrides})


ALLOCATION = {
    "metadata": {"namespace": "ml", "name": "train-abc-0"},
    "spec": {"podName": "train", "nodeName": "n1", "chip": 1, "template": "vir05_1c_16g"},
    "status": {"phase": "Ready"},
}


def operator_metrics() -> OperatorMetrics:
    metrics = OperatorMetrics()
    metrics.watch(
        StateView(
            allocations=lambda: [ALLOCATION],
            capacity=lambda: [_capacity()],
            waiting=lambda: [WaitingPod("ml", "wait", "insufficient-aicore", 30.0)],
            live_nodes=lambda: {"n1": True, "n2": False},
            fragmentation=lambda: {"n1": Fragmentation(15, 10, 1, 1)},
        )
    )
    metrics.watch_certificate(lambda: 1_900_000_000.0)
    metrics.allocation_latency.observe(1.5)
    metrics.release_latency.observe(0.5)
    metrics.placement_failures.labels("insufficient-aicore").inc()
    metrics.allocation_failures.labels("n1").inc()
    metrics.api_errors.labels("create_allocation", "500").inc()
    metrics.admission_requests.labels("mutate", "denied").inc()
    metrics.admission_denials.labels("mutate", "over-quota").inc()
    metrics.admission_duration.labels("mutate").observe(0.002)
    metrics.preemption_attempts.labels("evicted").inc()
    metrics.preemption_victims.inc()
    metrics.fenced_writes.labels("create_allocation").inc()
    metrics.dra_claims_refused.labels("AgentDown").inc()
    metrics.dra_slices_deleted.inc()
    return metrics


@dataclass
class FakeNodeAgent:
    """What the agent's scrape-time collector reads of a NodeAgent."""

    node: str = "n1"
    chips: list[ChipInfo] = field(default_factory=list)
    vnpus: dict[int, VNPU] = field(default_factory=dict)
    allocs: dict[str, dict[str, Any]] = field(default_factory=dict)
    owned: set[int] = field(default_factory=set)
    dra_pool_published: bool | None = True

    def referenced_ids(self) -> set[int]:
        return {a["spec"]["vnpuId"] for a in self.allocs.values()}


def fake_agent() -> FakeNodeAgent:
    chip = ChipInfo(
        index=1, physical_id=5, card_id=0, device_id=1, model="910B3", healthy=True,
        aicore_total=20, aicore_free=10, memory_total_mb=65536, memory_free_mb=32768,
        aicpu_total=7, aicpu_free=5, media_total=0, media_free=0,
        vnpu_id_min=180, vnpu_id_max=195,
    )  # fmt: skip
    return FakeNodeAgent(
        chips=[chip],
        vnpus={
            180: VNPU(180, 1, "vir05_1c_16g", in_use=True),
            181: VNPU(181, 1, "vir05_1c_16g", in_use=False),
            182: VNPU(182, 1, "vir05_1c_16g", in_use=False),
        },
        allocs={"ml/train-abc-0": {**ALLOCATION, "spec": {**ALLOCATION["spec"], "vnpuId": 180}}},
        owned={180, 181},
    )


def agent_metrics() -> AgentMetrics:
    metrics = AgentMetrics()
    agent = fake_agent()
    metrics.watch(lambda: [cast(Any, agent)])
    metrics.driver_op("n1", "create", "ok", 0.01)
    metrics.gc_action("n1", "orphan")
    metrics.released("n1")
    metrics.node_restored("n1", "deleted")
    metrics.api_errors.labels("patch_lease", "500").inc()
    metrics.dra_call("prepare", 0.2, 1)
    metrics.dra_pool_write("create")
    return metrics


def families(registry: CollectorRegistry) -> dict[str, Metric]:
    return {f.name: f for f in registry.collect()}


def sample(registry: CollectorRegistry, name: str) -> dict[str, Any]:
    """The labels and value of the one sample called `name`."""
    (found,) = [s for f in registry.collect() for s in f.samples if s.name == name]
    return {**found.labels, "value": found.value}


@pytest.mark.parametrize("build", [operator_metrics, agent_metrics], ids=["operator", "agent"])
def test_every_exported_metric_follows_the_rules(build: Any) -> None:
    registry = build().registry
    assert violations(registry.collect()) == []
    ours = {name: f for name, f in families(registry).items() if is_ours(name)}
    empty = [name for name, f in ours.items() if not f.samples]
    assert empty == [], f"not exercised here, so its labels go unchecked: {empty}"


@pytest.mark.parametrize(
    ("build", "prefix"),
    [(operator_metrics, "vnpu_operator"), (agent_metrics, "vnpu_agent")],
    ids=["operator", "agent"],
)
def test_process_platform_gc_collectors_and_build_info(build: Any, prefix: str) -> None:
    registry = build().registry
    assert families(registry).keys() >= STANDARD_FAMILIES
    assert sample(registry, f"{prefix}_build_info") == {"version": __version__, "value": 1.0}


def test_chip_capacity_is_one_quantity_per_metric_in_base_units() -> None:
    registry = operator_metrics().registry
    chip = {"node": "n1", "chip": "1", "id": "5", "model": "910B3"}
    assert sample(registry, "vnpu_operator_chip_memory_capacity_bytes") == {
        **chip, "value": 65536 * MIB,
    }  # fmt: skip
    assert sample(registry, "vnpu_operator_chip_memory_used_bytes")["value"] == 16384 * MIB
    assert sample(registry, "vnpu_operator_chip_aicore_capacity")["value"] == 20
    assert sample(registry, "vnpu_operator_chip_aicore_used")["value"] == 5
    assert sample(registry, "vnpu_operator_chip_aicpu_used")["value"] == 1
    assert sample(registry, "vnpu_operator_chip_vnpu_capacity")["value"] == 16
    agent = agent_metrics().registry
    assert sample(agent, "vnpu_agent_chip_memory_free_bytes") == {**chip, "value": 32768 * MIB}
    assert sample(agent, "vnpu_agent_chip_aicore_free")["value"] == 10


def test_waiting_pods_carry_reason_namespace_and_pod() -> None:
    registry = operator_metrics().registry
    assert sample(registry, "vnpu_operator_pods_waiting") == {
        "reason": "insufficient-aicore", "value": 1.0,
    }  # fmt: skip
    since = sample(registry, "vnpu_operator_pod_waiting_since_timestamp_seconds")
    assert since.pop("value") == pytest.approx(time.time() - 30.0, abs=5)
    assert since == {"namespace": "ml", "pod": "wait", "reason": "insufficient-aicore"}


def test_agent_labels_join_with_npu_exporter_and_kube_state_metrics() -> None:
    registry = agent_metrics().registry
    assert sample(registry, "vnpu_agent_allocation_info") == {
        "node": "n1", "namespace": "ml", "allocation": "train-abc-0", "pod": "train",
        "chip": "1", "id": "5", "v_dev_id": "180", "template": "vir05_1c_16g",
        "phase": "Ready", "value": 1.0,
    }  # fmt: skip
    states = {
        s.labels["state"]: s.value
        for f in registry.collect()
        if f.name == "vnpu_agent_vnpus"
        for s in f.samples
    }
    assert states == {"allocated": 1.0, "orphan": 1.0, "foreign": 1.0}


def test_certificate_expiry_is_absent_while_unknown_and_when_reading_it_fails() -> None:
    name = "vnpu_operator_webhook_certificate_expiration_timestamp_seconds"
    known = OperatorMetrics(CollectorRegistry())
    known.watch_certificate(lambda: 1_900_000_000.0)
    assert sample(known.registry, name) == {"value": 1_900_000_000.0}

    def broken() -> float | None:
        raise OSError("certificate file unreadable")

    for source in (lambda: None, broken):
        metrics = OperatorMetrics(CollectorRegistry())
        metrics.watch_certificate(source)
        assert families(metrics.registry)[name].samples == []


# ------------------------------------------------------------- the rules bite


class _OldNames(Collector):
    """Metrics as named before issue 16, and other mistakes the rules must catch."""

    def collect(self) -> Any:
        capacity = GaugeMetricFamily(
            "vnpu_operator_chip_capacity", "mixed", labels=["node", "chip", "resource", "kind"]
        )
        capacity.add_metric(["n1", "0", "memory_mb", "total"], 65536)
        info = GaugeMetricFamily(
            "vnpu_agent_allocation_info", "a gauge named info", labels=["name", "pod_name"]
        )
        info.add_metric(["a", "p"], 1)
        pods = GaugeMetricFamily("vnpu_operator_pods_total", "not a counter", labels=["pod"])
        pods.add_metric(["p"], 1)
        yield from (capacity, info, pods)


def test_the_rules_catch_the_names_they_replaced() -> None:
    registry = CollectorRegistry()
    registry.register(_OldNames())
    Histogram("vnpu_agent_driver_latency_ms", "ms", registry=registry).observe(1)
    Gauge("vnpu_operator_memory_bytes_free", "unit not last", registry=registry).set(1)
    Gauge("vnpu_operator_cert_timestamp", "no unit", registry=registry).set(1)
    Counter("npu_things_total", "no prefix", registry=registry).inc()
    found = "\n".join(violations(registry.collect()))
    for expected in (
        r"vnpu_operator_chip_capacity: has the label 'resource'",
        r"vnpu_operator_chip_capacity: has the label 'kind'",
        r"vnpu_operator_chip_capacity: label resource='memory_mb' carries a unit",
        r"vnpu_operator_chip_capacity: label kind='total' names a quantity",
        r"vnpu_operator_chip_capacity: labels a chip without node and id",
        r"vnpu_agent_allocation_info: ends in _info but is not an info metric",
        r"vnpu_agent_allocation_info: has the label 'name'",
        r"vnpu_agent_allocation_info: has the label 'pod_name'",
        r"vnpu_operator_pods_total: has _total in its family name",
        r"vnpu_operator_pods_total: gauge sample vnpu_operator_pods_total ends in _total",
        r"vnpu_operator_pods_total: labels a pod without its namespace",
        r"vnpu_agent_driver_latency_ms: has the non-base unit 'ms'",
        r"vnpu_agent_driver_latency_ms: is a histogram without a unit",
        r"vnpu_operator_memory_bytes_free: does not end in its one unit",
        r"vnpu_operator_cert_timestamp: is a timestamp not ending in _timestamp_seconds",
        r"npu_things: does not start with vnpu_operator_ or vnpu_agent_",
    ):
        assert re.search(re.escape(expected), found), f"{expected!r} not in:\n{found}"


# ------------------------------------------------------------------ the docs


def test_every_metric_is_documented_in_architecture() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("### Metrics") :]
    section = section[: section.index("\n#", 1)]
    exposed = set()  # as queried: counters with _total, info metrics with _info
    for registry in (operator_metrics().registry, agent_metrics().registry):
        for f in registry.collect():
            if is_ours(f.name):
                exposed.add(f.name + {"counter": "_total", "info": "_info"}.get(f.type, ""))
    undocumented = sorted(n for n in exposed if not re.search(f"`{n}[`{{]", section))
    assert undocumented == [], "docs/ARCHITECTURE.md, ### Metrics, does not name these"


# ------------------------------------------------------- the dashboard, the alerts

DASHBOARD = ROOT / "charts" / "vnpu-operator" / "files" / "dashboards" / "vnpu-operator.json"
RULES = ROOT / "charts" / "vnpu-operator" / "templates" / "prometheusrule.yaml"
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$node": ".*"}


def _queryable() -> dict[str, set[str]]:
    """Series name -> the label names its samples carry, for everything both
    components export (as a query names it: _total, _info, _bucket...), and
    Prometheus' own `up` with the labels the chart's ServiceMonitor gives it."""
    out: dict[str, set[str]] = {"up": {"job", "namespace", "node", "pod", "instance"}}
    for registry in (operator_metrics().registry, agent_metrics().registry):
        for f in registry.collect():
            for s in f.samples:
                out.setdefault(s.name, set()).update(s.labels)
    return out


def _unknown(where: str, expr: str, known: dict[str, set[str]]) -> list[str]:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    found: list[tuple[str, list[str]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, [m.name for m in node.matchers.matchers]))

    promql_parser.walk(promql_parser.parse(expr), visit)
    problems = [] if found else [f"{where}: selects no series"]
    for series, labels in found:
        if series not in known:
            problems.append(f"{where}: {series} is not exported")
        elif missing := set(labels) - known[series]:
            problems.append(f"{where}: {series} has no label {sorted(missing)}")
    return problems


def test_every_dashboard_query_names_exported_series_and_labels() -> None:
    """The run-time check is tests/integration/test_metrics_series.py; this one
    needs no plane, so a panel on a renamed or missing metric fails at once."""
    board = json.loads(DASHBOARD.read_text())
    known = _queryable()
    problems = [
        problem
        for p in board["panels"]
        for t in p.get("targets", [])
        for problem in _unknown(f"{p['title']} [{t['refId']}]", t["expr"], known)
    ]
    assert problems == [], "\n".join(problems)
    titles = {p["title"] for p in board["panels"]}
    assert {"Leader by replica", "Leader changes", "vNPUs by namespace"} <= titles


def test_every_alert_names_exported_series_and_labels() -> None:
    """The rules' expressions as the template writes them, its values put in."""
    text = RULES.read_text()
    exprs = dict(re.findall(r"^- alert: (\w+)\n  expr: (.+)$", text, re.MULTILINE))
    assert len(exprs) == len(re.findall(r"^- alert: ", text, re.MULTILINE))
    known = _queryable()
    problems = []
    for alert, expr in exprs.items():
        expr = expr.replace("{{ $up }}", 'up{job="a", namespace="b"}')
        expr = re.sub(r"\{\{ \$rule\.\w+ \}\}", "1", expr)
        assert "{{" not in expr, f"{alert}: a template the test does not know: {expr}"
        problems += _unknown(alert, expr, known)
    assert problems == [], "\n".join(problems)
