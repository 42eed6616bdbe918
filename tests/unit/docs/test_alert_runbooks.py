"""Every alert the chart can render has its runbook: a `### <alert>` section
under docs/TROUBLESHOOTING.md's `## Alerts`, with what to check with kubectl,
at the anchor its runbook_url names (the template appends the alert's name in
lower case to metrics.prometheusRule.runbookBaseURL, whose default is that
file on the project's main branch). Every alert also has its entry under
metrics.prometheusRule.rules in values.yaml and the schema, so none can be
left without a severity or a switch. Read from the chart's text: the render
itself is tests/integration/test_alert_rules.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from test_doc_links import anchors, github_anchor

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "vnpu-operator"
DOC = ROOT / "docs" / "TROUBLESHOOTING.md"
REPO_BLOB = "https://github.com/vnpu-operator/vnpu-operator/blob/main/"


def template_alerts() -> list[str]:
    text = (CHART / "templates" / "prometheusrule.yaml").read_text()
    return re.findall(r"^- alert: (\w+)$", text, re.MULTILINE)


def rule_values() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rule: dict[str, Any] = values["metrics"]["prometheusRule"]
    return rule


def alert_sections() -> dict[str, str]:
    """`### ` sections of `## Alerts`, by heading."""
    text = DOC.read_text()
    part = text[text.index("\n## Alerts\n") :]
    following = re.search(r"\n## ", part[1:])
    part = part[: following.start() + 1] if following else part
    sections = re.split(r"^### (.+)$", part, flags=re.MULTILINE)
    return {sections[i]: sections[i + 1] for i in range(1, len(sections), 2)}


def test_the_template_names_the_alerts() -> None:
    alerts = template_alerts()
    assert len(alerts) == len(set(alerts)) >= 17
    assert {"VNPUNodeAgentDown", "VNPUDRAResourceSlicesMissing", "VNPUDRAPrepareErrors"} <= set(
        alerts
    )


def test_every_alert_has_a_runbook_with_kubectl_at_its_anchor() -> None:
    sections = alert_sections()
    doc_anchors = anchors(DOC)
    problems = []
    for alert in template_alerts():
        # What the template's `lower` makes must be GitHub's anchor of the heading.
        if github_anchor(alert) != alert.lower():
            problems.append(f"{alert}: GitHub makes #{github_anchor(alert)}, not its lower case")
        if alert.lower() not in doc_anchors:
            problems.append(f"{alert}: no heading makes #{alert.lower()}")
        if alert not in sections:
            problems.append(f"{alert}: no ### {alert} under ## Alerts")
        elif "kubectl " not in sections[alert]:
            problems.append(f"{alert}: its section says nothing to check with kubectl")
    assert problems == [], "\n".join(problems)
    assert set(sections) == set(template_alerts()), "a runbook for an alert the chart lacks"


def test_the_default_runbook_base_is_this_file_on_main() -> None:
    base = rule_values()["runbookBaseURL"]
    assert base.startswith(REPO_BLOB)
    assert (ROOT / base.removeprefix(REPO_BLOB)) == DOC


def test_every_alert_has_a_switch_and_a_severity_in_values_and_schema() -> None:
    rules = rule_values()["rules"]
    assert list(rules) == template_alerts()
    for alert, setting in rules.items():
        assert setting == {"enabled": True, "severity": setting["severity"]}, alert
        assert setting["severity"] in ("critical", "warning", "info"), alert
    schema = json.loads((CHART / "values.schema.json").read_text())
    prometheus_rule = schema["properties"]["metrics"]["properties"]["prometheusRule"]
    by_alert = prometheus_rule["properties"]["rules"]
    assert by_alert["additionalProperties"] is False
    assert set(by_alert["properties"]) == set(rules)
    for alert, entry in by_alert["properties"].items():
        assert entry["additionalProperties"] is False, alert
        assert entry["properties"]["severity"]["enum"] == ["critical", "warning", "info"]
