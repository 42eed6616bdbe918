"""The chart's alerts as Prometheus runs them: the PrometheusRule rendered with
every group on (the ServiceMonitor's VNPUNodeAgentDown, the DRA group) passes
`promtool check rules`, and `promtool test rules` runs tests/alerts/*.yaml on
it: every alert fires on its bad series with its labels and annotations,
runbook_url included, and stays quiet on the good ones. promtool is built from
its Go module (hack/tools/build.sh; `make test` builds it first). Also: each
rule can be turned off or given another severity, the runbook base is a value,
and the schema refuses what is not an alert or a severity."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import RELEASE, render, template

from localplane import LocalPlane

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "alerts"
# As the rule tests expect them: the README's install.
NAMESPACE = "vnpu-system"
ALL_ON = (
    "--set", "metrics.prometheusRule.enabled=true",
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "agent.dra=true",
    "--kube-version", "1.36.0",
    "--api-versions", "monitoring.coreos.com/v1",
)  # fmt: skip


@pytest.fixture(scope="module")
def promtool() -> Path:
    build = subprocess.run(
        ["bash", str(ROOT / "hack" / "tools" / "build.sh"), "promtool"],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    lines = build.stdout.strip().splitlines()
    if build.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        pytest.fail(
            "promtool could not be built from its Go module (bash hack/tools/build.sh promtool, "
            "which needs go and the module proxy or a warm module cache; `make check-tools` "
            f"builds it): exit {build.returncode}\n{build.stdout}\n{build.stderr}"
        )
    return Path(lines[-1])


def rule_groups(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups(docs) for r in g["rules"]}


def run(promtool: Path, where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=where, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip


def fired(test_files: list[Path]) -> set[str]:
    """The alerts some test expects to fire. promtool compares the alerts firing
    with exp_alerts exactly, so the good series beside the bad ones (every test
    has some) are shown quiet by the same case."""
    return {
        case["alertname"]
        for path in test_files
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test") or []
        if case.get("exp_alerts")
    }


def test_promtool_checks_the_rules_and_every_alerts_tests_pass(
    plane: LocalPlane, promtool: Path, tmp_path: Path
) -> None:
    docs = render(plane, *ALL_ON, namespace=NAMESPACE)
    # The rules file Prometheus would load: the PrometheusRule's spec.
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups(docs)}))
    test_files = sorted(TESTS.glob("*.yaml"))
    assert test_files, f"no rule tests in {TESTS}"
    for path in test_files:
        # Their rule_files name rules.yaml beside them.
        assert yaml.safe_load(path.read_text())["rule_files"] == ["rules.yaml"], path.name
        shutil.copy(path, tmp_path / path.name)

    checked = run(promtool, tmp_path, "check", "rules", "rules.yaml")
    assert checked.returncode == 0, f"promtool check rules:\n{checked.stdout}\n{checked.stderr}"
    rendered = alerts(docs)
    assert f"SUCCESS: {len(rendered)} rules found" in checked.stdout, checked.stdout

    untested = sorted(set(rendered) - fired(test_files))
    assert untested == [], f"alerts no rule test fires: {untested}"
    assert fired(test_files) <= set(rendered), "a rule test names an alert the chart lacks"

    result = run(promtool, tmp_path, "test", "rules", *(p.name for p in test_files))
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.count("SUCCESS") == len(test_files), result.stdout


def test_every_rule_links_its_runbook_and_the_base_is_a_value(plane: LocalPlane) -> None:
    base = "https://github.com/vnpu-operator/vnpu-operator/blob/main/docs/TROUBLESHOOTING.md"
    for alert, rule in alerts(render(plane, *ALL_ON)).items():
        assert rule["annotations"]["runbook_url"] == f"{base}#{alert.lower()}", alert
    fork = "https://git.example.com/we/vnpu/src/branch/main/docs/TROUBLESHOOTING.md"
    setting = f"metrics.prometheusRule.runbookBaseURL={fork}"
    forked = alerts(render(plane, *ALL_ON, "--set", setting))
    assert {r["annotations"]["runbook_url"] for r in forked.values()} == {
        f"{fork}#{alert.lower()}" for alert in forked
    }


def test_a_rule_turned_off_is_not_rendered_and_severity_is_a_value(plane: LocalPlane) -> None:
    defaults = alerts(render(plane, *ALL_ON))
    assert len(defaults) == 17
    assert defaults["VNPUOperatorAbsent"]["labels"] == {"severity": "critical"}
    assert defaults["VNPUDRAPrepareErrors"]["labels"] == {"severity": "warning"}
    changed = alerts(render(
        plane, *ALL_ON,
        "--set", "metrics.prometheusRule.rules.VNPUPodWaitingTooLong.enabled=false",
        "--set", "metrics.prometheusRule.rules.VNPUDRAPoolChurn.enabled=false",
        "--set", "metrics.prometheusRule.rules.VNPUChipUnhealthy.severity=critical",
        "--set", "metrics.prometheusRule.rules.VNPUDRAPrepareSlow.severity=info",
    ))  # fmt: skip
    assert set(defaults) - set(changed) == {"VNPUPodWaitingTooLong", "VNPUDRAPoolChurn"}
    assert changed["VNPUChipUnhealthy"]["labels"] == {"severity": "critical"}
    assert changed["VNPUDRAPrepareSlow"]["labels"] == {"severity": "info"}
    for alert in set(changed) - {"VNPUChipUnhealthy", "VNPUDRAPrepareSlow"}:
        assert changed[alert] == defaults[alert], alert

    # Every DRA rule off: the group goes, the other stays.
    dra = [a for a in defaults if a.startswith("VNPUDRA")]
    off = [x for a in dra for x in ("--set", f"metrics.prometheusRule.rules.{a}.enabled=false")]
    docs = render(plane, *ALL_ON, *off)
    assert [g["name"] for g in rule_groups(docs)] == ["vnpu-operator"]


def test_agent_down_needs_the_charts_service_monitor_and_keys_on_its_targets(
    plane: LocalPlane,
) -> None:
    """It reads `up` of the agents' targets, job the agents' metrics Service, with the
    node the ServiceMonitor's relabeling gives them; without that ServiceMonitor the
    job and the node label are unknown, so the rule is not rendered."""
    without = alerts(render(plane, *ALL_ON, "--set", "metrics.serviceMonitor.enabled=false"))
    assert "VNPUNodeAgentDown" not in without
    docs = render(plane, *ALL_ON, namespace=NAMESPACE)
    expr = alerts(docs)["VNPUNodeAgentDown"]["expr"]
    service = f"{RELEASE}-agent-metrics"
    assert expr.count(f'up{{job="{service}", namespace="{NAMESPACE}"}}') == 2, expr
    assert [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == service]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    (relabel,) = endpoint["relabelings"]
    assert relabel["targetLabel"] == "node"
    assert relabel["sourceLabels"] == [
        "__meta_kubernetes_service_name", "__meta_kubernetes_pod_node_name",
    ]  # fmt: skip
    # Only the agents' Service: the operator's series name their own nodes.
    pattern = re.compile(relabel["regex"])
    assert pattern.fullmatch(f"{service};npu-1")
    assert not pattern.fullmatch(f"{RELEASE}-operator-metrics;npu-1")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("metrics.prometheusRule.rules.VNPUChipUnhealthy.severity=page", "severity"),
        ("metrics.prometheusRule.rules.VNPUNoSuchAlert.enabled=false", "VNPUNoSuchAlert"),
        ("metrics.prometheusRule.rules.VNPUChipUnhealthy.for=5m", "for"),
        ("metrics.prometheusRule.runbookBaseURL=docs/TROUBLESHOOTING.md", "runbookBaseURL"),
        ("metrics.prometheusRule.draSlicesMissingFor=ten minutes", "draSlicesMissingFor"),
    ],
)
def test_the_schema_refuses_bad_alert_values(plane: LocalPlane, setting: str, message: str) -> None:
    proc = template(plane, *ALL_ON, "--set", setting, check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert message in proc.stderr, proc.stderr
