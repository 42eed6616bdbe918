"""The metrics of a real run, and the alerts and dashboard the chart ships on them.

An operator and an agent on the local plane serve a placed pod, a pod waiting
for capacity, a released pod and a pod the webhook refuses; both are scraped
as Prometheus scrapes them (OpenMetrics, gzip). Every exported name follows
the naming rules, and every series the chart's PrometheusRule and Grafana
dashboard query is one the run exports, with label names it has. The
dashboard is printed panel by panel with the run's values (pytest -s): there
is no Grafana here to take a picture of it.
"""

from __future__ import annotations

import gzip
import json
import re
import urllib.request
from typing import Any

import promql_parser
import pytest
import yaml
from chart_harness import template
from operator_harness import Stack, StackOf, get_json
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from localplane import LocalPlane, NodeSpec
from localplane.metric_rules import STANDARD_FAMILIES, is_ours, violations
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

NODE = "metrics-a"
TEMPLATE = "vir05_1c_16g"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
MONITORING = ("--api-versions", "monitoring.coreos.com/v1")
ENABLED = (
    "--set", "metrics.prometheusRule.enabled=true",
    "--set", "metrics.grafanaDashboard.enabled=true",
)  # fmt: skip
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$node": ".*"}
# Series Prometheus makes itself, not an exporter.
PROMETHEUS_OWN = frozenset({"up"})


@pytest.fixture(scope="module")
def stack(stack_of: StackOf) -> Stack:
    return stack_of(
        [NodeSpec(name=NODE, chips={"910B3": 2}, labels={"metrics-test": NODE})],
    )


def scrape(port: int) -> tuple[urllib.response.addinfourl, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response, response.read()


def families(port: int) -> dict[str, Metric]:
    response, body = scrape(port)
    assert response.headers["Content-Type"].startswith("application/openmetrics-text"), (
        response.headers
    )
    assert response.headers.get("Content-Encoding") == "gzip", response.headers
    return {f.name: f for f in text_string_to_metric_families(gzip.decompress(body).decode())}


def queryable(family: Metric) -> list[str]:
    """The series names a query may use for a family."""
    suffixes = {
        "counter": ["_total"],
        "info": ["_info"],
        "histogram": ["_bucket", "_count", "_sum"],
    }.get(family.type, [""])
    return [family.name + s for s in suffixes]


@pytest.fixture(scope="module")
def exported(stack: Stack, plane: LocalPlane) -> dict[str, Metric]:
    """Both components' families, scraped after a run with one of each thing."""
    ns = "metrics-run"
    plane.kubectl("create", "namespace", ns, check=False)
    on_node = {"metrics-test": NODE}
    for name in ("placed", "released"):
        plane.apply(vnpu_pod(name, ns, template=TEMPLATE, node_selector=on_node))
    plane.apply(vnpu_pod("waits", ns, template=TEMPLATE, node_selector={"metrics-test": "none"}))
    refused = plane.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(vnpu_pod("refused", ns, template="vir99")),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0, "the webhook let a pod ask for an unknown template"
    assert "vir99" in refused.stderr, refused.stderr

    def running(name: str) -> bool:
        pod = get_json(plane, "pod", "-n", ns, name) or {}
        return (pod.get("status") or {}).get("phase") == "Running"

    wait_for("pods running", lambda: running("placed") and running("released"), timeout=60)
    plane.kubectl("delete", "pod", "-n", ns, "released", "--wait=false")
    wait_for(
        "pod released",
        lambda: not get_json(plane, "pod", "-n", ns, "released"),
        timeout=60,
    )
    # What a careless hand and an admin do: take a label off the agent's
    # VNPUNode, make a vNPU with npu-smi behind the agent's back, cordon a
    # chip. The label first: the agent's own write for the cordon would put
    # the label back before the agent saw it gone.
    plane.kubectl("label", names.NODE_PLURAL, NODE, f"{names.LABEL_NODE}-")
    wait_for(
        "VNPUNode restored",
        lambda: families(stack.agent.port)["vnpu_agent_vnpunode_restorations"].samples,
        timeout=30,
    )
    stack.agent.sim(NODE).create_vnpu(0, TEMPLATE, 115)
    body = {"spec": {"cordonedChips": [{"chip": 1, "reason": "metrics test"}]}}
    plane.kubectl("patch", names.NODE_PLURAL, NODE, "--type=merge", "-p", json.dumps(body))

    missing: list[str] = []

    def seen() -> bool:
        operator, agent = families(stack.operator.port), families(stack.agent.port)
        waiting = operator["vnpu_operator_pod_waiting_since_timestamp_seconds"].samples
        missing[:] = [
            what
            for what, there in [
                ("waiting pod", any(s.labels["pod"] == "waits" for s in waiting)),
                ("cordoned chip", operator["vnpu_operator_chip_unavailable"].samples),
                ("foreign vNPU kept", agent["vnpu_agent_gc_actions"].samples),
            ]
            if not there
        ]
        return not missing

    try:
        wait_for("the run's state in the metrics", seen, timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"not in the metrics: {missing}") from exc
    out = families(stack.operator.port)
    agent = families(stack.agent.port)
    # Only the library's collectors share names; ours say which component they come from.
    assert [n for n in out.keys() & agent.keys() if is_ours(n)] == []
    return {**agent, **out}


def test_every_scraped_name_follows_the_rules(exported: dict[str, Metric]) -> None:
    assert violations(exported.values()) == []
    assert exported.keys() >= STANDARD_FAMILIES
    (build,) = exported["vnpu_operator_build"].samples
    assert build.name == "vnpu_operator_build_info"
    assert build.labels["version"]


def test_a_run_exports_the_state_it_holds(exported: dict[str, Metric]) -> None:
    """The placed pod, the waiting one, the refused one and the released one."""

    def samples(family: str) -> list[dict[str, Any]]:
        return [{**s.labels, "=": s.value} for s in exported[family].samples]

    assert {"phase": names.PHASE_READY, "template": TEMPLATE, "node": NODE, "=": 1.0} in samples(
        "vnpu_operator_allocations"
    )
    (info,) = [s for s in samples("vnpu_agent_allocation") if s["pod"] == "placed"]
    assert info["namespace"] == "metrics-run"
    assert info["v_dev_id"].isdigit()
    assert info["id"] != "", "allocation info without the chip's physical id"
    (wait,) = [s for s in samples("vnpu_operator_pod_waiting_since_timestamp_seconds")]
    assert (wait["namespace"], wait["pod"], wait["reason"]) == (
        "metrics-run", "waits", "node-selector",
    )  # fmt: skip
    assert {"reason": "node-selector", "=": 1.0} in samples("vnpu_operator_pods_waiting")
    denials = samples("vnpu_operator_admission_denials")
    assert [d for d in denials if d["reason"] == "invalid-request" and d["="] >= 1]
    released = [s for s in samples("vnpu_operator_release_latency_seconds") if "le" not in s]
    assert [s for s in released if s["="] >= 1], released
    capacity = samples("vnpu_operator_chip_memory_capacity_bytes")
    assert sorted((c["node"], c["chip"], c["="]) for c in capacity) == [
        (NODE, "0", 64 * 1024**3),
        (NODE, "1", 64 * 1024**3),
    ]
    # The vNPU made behind the agent's back: foreign to the agent, undeclared to the operator.
    chip0 = {"node": NODE, "chip": "0", "id": "0", "model": "910B3"}
    assert {**chip0, "state": "undeclared", "=": 1.0} in samples("vnpu_operator_chip_vnpus")
    foreign = {**chip0, "template": TEMPLATE, "state": "foreign", "=": 1.0}
    assert foreign in samples("vnpu_agent_vnpus")
    assert {**chip0, "id": "1", "chip": "1", "reason": "cordoned", "=": 1.0} in samples(
        "vnpu_operator_chip_unavailable"
    )
    expiry = samples("vnpu_operator_webhook_certificate_expiration_timestamp_seconds")
    assert [e["="] > 0 for e in expiry] == [True]


def test_metrics_answer_plain_text_to_a_plain_client(stack: Stack) -> None:
    """curl and older scrapers get the text format, uncompressed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.agent.port}/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        assert response.headers.get("Content-Encoding") is None
        assert b"# TYPE vnpu_agent_build_info gauge" in response.read()


# ------------------------------------------------------------ alerts, dashboard


def rendered(plane: LocalPlane, *args: str) -> list[dict[str, Any]]:
    out = template(plane, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def rule_exprs(docs: list[dict[str, Any]]) -> dict[str, str]:
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}


def dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    board: dict[str, Any] = json.loads(text)
    return board


def dashboard_exprs(board: dict[str, Any]) -> dict[str, str]:
    out = {
        f"{p['title']} [{t['refId']}]": t["expr"]
        for p in board["panels"]
        for t in p.get("targets", [])
    }
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
            assert found, var["definition"]
            out[f"variable {var['name']}"] = f"{found[1]}{{{found[2]}=~'.+'}}"
    return out


def selectors(expr: str) -> list[tuple[str, list[str]]]:
    """(series name, label names matched) of every selector of a query."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    found: list[tuple[str, list[str]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, [m.name for m in node.matchers.matchers]))

    promql_parser.walk(promql_parser.parse(expr), visit)
    assert found, f"selects no series: {expr}"
    return found


def unknown_series(queries: dict[str, str], exported: dict[str, Metric]) -> list[str]:
    by_series = {name: f for f in exported.values() for name in queryable(f)}
    problems = []
    for where, expr in queries.items():
        for series, labels in selectors(expr):
            family = by_series.get(series)
            if family is None:
                if series not in PROMETHEUS_OWN:
                    problems.append(f"{where}: {series} is not exported")
                continue
            if not labels:
                continue
            if not family.samples:
                problems.append(f"{where}: {series} had no sample in the run to check labels on")
                continue
            missing = set(labels) - {k for s in family.samples for k in s.labels}
            if missing:
                problems.append(f"{where}: {series} has no label {sorted(missing)}")
    return problems


def test_every_alert_queries_series_the_run_exports(
    plane: LocalPlane, exported: dict[str, Metric]
) -> None:
    exprs = rule_exprs(rendered(plane, *ENABLED, *MONITORING))
    assert set(exprs) == {
        "VNPUOperatorAbsent", "VNPUWebhookFailing", "VNPUWebhookCertificateExpiring",
        "VNPUPodWaitingTooLong", "VNPUAllocationFailures", "VNPUNodeAgentNotLive",
        "VNPUOrphansLingering", "VNPUChipUnhealthy", "VNPUAllocationLatencyHigh",
        "VNPUOperatorAPIErrors", "VNPUOperatorNoLeader",
    }  # fmt: skip
    problems = unknown_series(exprs, exported)
    assert problems == [], "\n".join(problems)


def test_every_dashboard_query_names_series_the_run_exports(
    plane: LocalPlane, exported: dict[str, Metric]
) -> None:
    board = dashboard(rendered(plane, *ENABLED))
    problems = unknown_series(dashboard_exprs(board), exported)
    assert problems == [], "\n".join(problems)
    print("\n" + "\n".join(look(board, exported)))


def test_dashboard_panels_are_laid_out_and_use_the_chosen_datasource(plane: LocalPlane) -> None:
    board = dashboard(rendered(plane, *ENABLED))
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] in range(24 - g["w"] + 1), p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["description"], p["title"]


def test_the_chart_renders_alerts_only_where_the_cluster_serves_them(plane: LocalPlane) -> None:
    kinds = [d["kind"] for d in rendered(plane)]
    assert "PrometheusRule" not in kinds
    assert not [k for k in kinds if k == "ConfigMap"]
    assert "PrometheusRule" not in [d["kind"] for d in rendered(plane, *ENABLED)]
    assert "PrometheusRule" in [d["kind"] for d in rendered(plane, *ENABLED, *MONITORING)]


def test_thresholds_and_labels_come_from_values(plane: LocalPlane) -> None:
    docs = rendered(
        plane, *ENABLED, *MONITORING,
        "--set", "metrics.prometheusRule.podWaitingSeconds=1234",
        "--set-json", "metrics.prometheusRule.allocationP99Seconds=7.5",
        "--set", "metrics.prometheusRule.labels.release=kps",
        "--set", "metrics.grafanaDashboard.labels.custom_dashboards=yes",
        "--set", "metrics.grafanaDashboard.namespace=monitoring",
    )  # fmt: skip
    exprs = rule_exprs(docs)
    assert exprs["VNPUPodWaitingTooLong"].endswith("> 1234")
    assert exprs["VNPUAllocationLatencyHigh"].endswith("> 7.5")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kps"
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["custom_dashboards"] == "yes"


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("metrics.prometheusRule.podWaitingSeconds=soon", "podWaitingSeconds"),
        ("metrics.prometheusRule.orphanFor=30 minutes", "orphanFor"),
        ("metrics.grafanaDashboard.namespace=Not_A_Namespace", "namespace"),
        ("metrics.grafanaDashboard.labelz.x=1", "labelz"),
    ],
)
def test_bad_monitoring_values_are_refused_by_the_schema(
    plane: LocalPlane, setting: str, complaint: str
) -> None:
    proc = template(plane, *ENABLED, "--set", setting, check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert complaint in proc.stderr, proc.stderr


# -------------------------------------------------------------- looking at it


def look(board: dict[str, Any], exported: dict[str, Metric]) -> list[str]:
    """The dashboard as text: each panel with its queries' raw series and
    their values in this run (no PromQL engine here: the selectors only)."""
    by_series = {name: f for f in exported.values() for name in queryable(f)}
    lines = [f"=== {board['title']} ==="]
    for p in board["panels"]:
        if p["type"] == "row":
            lines.append(f"--- {p['title']} ---")
            continue
        lines.append(f"[{p['type']}] {p['title']}")
        for t in p["targets"]:
            for series, _ in selectors(t["expr"]):
                family = by_series.get(series)
                values = [
                    f"{_labels(s.labels)}={s.value:g}"
                    for s in (family.samples if family else [])
                    if s.name == series
                ][:4]
                lines.append(f"    {series}: {', '.join(values) or '(no sample)'}")
    return lines


def _labels(labels: dict[str, str]) -> str:
    shown = {k: v for k, v in labels.items() if k not in ("le",)}
    return "{" + ",".join(f"{k}={v}" for k, v in shown.items()) + "}"
