"""The chart speaks the components' settings: every `VNPU_*` variable it sets
is one the component reads under that name (a renamed setting cannot leave
the chart setting a variable nobody reads), the agents' namespace reaches
both components under its one name, and `logFormat` reaches both."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
import yaml
from chart_harness import CHART, template
from pydantic_settings import BaseSettings

from localplane import LocalPlane
from vnpu_agent.config import AgentSettings
from vnpu_common.process.logs import LogFormat
from vnpu_operator.config import OperatorSettings

pytestmark = pytest.mark.plane

NAMESPACE = "vnpu-settings"
SIM = ("--set", "agent.driver=sim", "--set", "agent.simChips=910B3=2")
REAL = ("--set", "agent.driver=dcmi")


def _containers(plane: LocalPlane, *values: str) -> dict[str, dict[str, Any]]:
    """Container env (name -> value) of the operator Deployment and the agent DaemonSet."""
    docs = [
        d for d in yaml.safe_load_all(template(plane, *values, namespace=NAMESPACE).stdout) if d
    ]
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            out[doc["kind"]] = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert set(out) == {"Deployment", "DaemonSet"}, set(out)
    return out


def _variables(model: type[BaseSettings]) -> set[str]:
    return {"VNPU_" + name.upper() for name in model.model_fields}


@pytest.mark.parametrize("values", [SIM, REAL], ids=["sim", "dcmi"])
def test_every_variable_the_chart_sets_is_read_by_its_component(
    plane: LocalPlane, values: tuple[str, ...]
) -> None:
    env = _containers(plane, *values)
    for kind, model in (("Deployment", OperatorSettings), ("DaemonSet", AgentSettings)):
        ours = {name for name in env[kind] if name.startswith("VNPU_")}
        assert ours, kind
        assert ours <= _variables(model), (kind, sorted(ours - _variables(model)))


def test_one_namespace_name_reaches_both_components(plane: LocalPlane) -> None:
    env = _containers(plane, *SIM)
    assert env["Deployment"]["VNPU_AGENT_NAMESPACE"] == NAMESPACE
    assert env["DaemonSet"]["VNPU_AGENT_NAMESPACE"] == NAMESPACE
    # The deprecated name is the agent's alias only; the chart never sets it.
    assert "VNPU_NAMESPACE" not in env["DaemonSet"]


def test_log_format_reaches_both_components(plane: LocalPlane) -> None:
    env = _containers(plane, *SIM)
    assert (env["Deployment"]["VNPU_LOG_FORMAT"], env["DaemonSet"]["VNPU_LOG_FORMAT"]) == (
        "text",
        "text",
    )
    env = _containers(
        plane, *SIM, "--set", "operator.logFormat=json", "--set", "agent.logFormat=json"
    )
    assert (env["Deployment"]["VNPU_LOG_FORMAT"], env["DaemonSet"]["VNPU_LOG_FORMAT"]) == (
        "json",
        "json",
    )


def test_the_schema_allows_the_log_formats_the_components_do() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    for component in ("operator", "agent"):
        allowed = schema["properties"][component]["properties"]["logFormat"]["enum"]
        assert allowed == list(get_args(LogFormat)), component


def test_the_schema_refuses_an_unknown_log_format(plane: LocalPlane) -> None:
    proc = template(plane, *SIM, "--set", "agent.logFormat=xml", check=False, namespace=NAMESPACE)
    assert proc.returncode != 0
    assert "at '/agent/logFormat': value must be one of 'text', 'json'" in proc.stderr, proc.stderr
