"""The components as an admin runs them, on the real plane: with
--log-format=json every line either writes is one JSON object; the agent's
old namespace variable still works and says it is deprecated; a bad variable
stops a component at start with a message naming it; an API server outage is
WARNING lines naming what is retried and when, never a traceback."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess, ServiceProcess
from localplane.waiting import wait_for

pytestmark = pytest.mark.plane

KEYS = {"time", "level", "logger", "message"}


def _json_lines(proc: ServiceProcess) -> list[dict[str, Any]]:
    lines = [line for line in proc.log_path.read_text().splitlines() if line.strip()]
    assert lines, f"{proc.name} wrote no log"
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{proc.name} wrote a line that is not JSON: {line!r}")
        assert set(record) >= KEYS, record
        records.append(record)
    return records


def _written(proc: ServiceProcess) -> list[dict[str, Any]]:
    """The JSON lines the process has written so far (one still being
    written, without its newline, is left for the next read)."""
    text = proc.log_path.read_text() if proc.log_path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _node(plane: LocalPlane, name: str) -> str:
    plane.add_nodes([NodeSpec(name=name, chips={"910B3": 1})])
    if plane.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode != 0:
        plane.kubectl("create", "namespace", AGENT_NAMESPACE)
    return name


def test_agent_logs_json_and_warns_about_its_old_namespace_variable(
    plane: LocalPlane, tmp_path: Path
) -> None:
    node = _node(plane, "logs-agent-node")
    agent = AgentProcess(
        plane,
        tmp_path,
        [node],
        settings={**AgentProcess.QUICK, "log-format": "json"},
        env={"VNPU_NAMESPACE": AGENT_NAMESPACE},
    ).start()
    agent.kill(signal.SIGTERM)
    records = _json_lines(agent)
    said = {(r["level"], r["logger"], r["message"]) for r in records}
    assert ("INFO", "vnpu_agent.main", "serving 1 node(s) with the sim driver") in said
    assert ("INFO", "vnpu_agent.main", "stopped") in said
    (warning,) = [r for r in records if "deprecated" in r["message"]]
    assert warning["level"] == "WARNING"
    assert "use --agent-namespace / VNPU_AGENT_NAMESPACE" in warning["message"]
    # That other libraries' loggers go through the same handler is
    # tests/unit/common/test_logs.py's: uvloop, the agent's loop, writes no
    # start line of its own as asyncio's selector loop did.


def test_operator_logs_json(plane: LocalPlane, tmp_path: Path) -> None:
    """Kopf's own lines are WARNING and above (none in a clean run); that they
    go through the same handler is tests/unit/common/test_logs.py's."""
    operator = OperatorProcess(
        plane, tmp_path, settings={**OperatorProcess.QUICK, "log-format": "json"}
    ).start()
    operator.kill(signal.SIGTERM)
    loggers = {r["logger"].split(".")[0] for r in _json_lines(operator)}
    assert "vnpu_operator" in loggers, loggers


def test_a_bad_variable_stops_the_agent_naming_it(plane: LocalPlane, tmp_path: Path) -> None:
    node = _node(plane, "logs-bad-agent-node")
    agent = AgentProcess(plane, tmp_path, [node], env={"VNPU_LOG_FORMAT": "xml"})
    with pytest.raises(AssertionError, match="agent exited with 2") as exc:
        agent.start(ready_timeout=20)
    assert "--log-format (VNPU_LOG_FORMAT): Input should be 'text' or 'json' (got 'xml')" in str(
        exc.value
    )


def _retries(records: list[dict[str, Any]], needle: str) -> list[dict[str, Any]]:
    return [r for r in records if needle in r["message"] and "; retr" in r["message"]]


def test_an_api_server_outage_is_logged_as_retries_without_tracebacks(
    plane: LocalPlane, tmp_path: Path
) -> None:
    """Both components cut off from the API server (killed, started again):
    each retried watch, and the operator's webhook certificate renewal
    (polled each second here), logs one WARNING line saying what failed, the
    fault in short and when it is retried; no line carries a traceback, none
    is an ERROR, and both are ready again once the server is back."""
    node = _node(plane, "logs-outage-node")
    operator = OperatorProcess(
        plane,
        tmp_path / "operator",
        settings={**OperatorProcess.QUICK, "log-format": "json", "webhook-cert-poll-seconds": 1},
    ).start()
    agent = AgentProcess(
        plane, tmp_path / "agent", [node], settings={**AgentProcess.QUICK, "log-format": "json"}
    ).start()
    try:
        before = {p.name: len(_written(p)) for p in (operator, agent)}

        def retried() -> bool:
            ours = _written(operator)[before[operator.name] :]
            theirs = _written(agent)[before[agent.name] :]
            return bool(
                _retries(ours, " watch failed (")
                and _retries(ours, "webhook certificate refresh failed (")
                and _retries(theirs, " watch failed (")
            )

        plane.kill_apiserver()
        try:
            wait_for("both components retrying their API calls", retried, timeout=30)
        finally:
            plane.start_apiserver()
        wait_for("the operator ready again", operator.ready, timeout=60)
        wait_for("the agent ready again", agent.ready, timeout=60)
    finally:
        try:
            operator.kill(signal.SIGTERM)
        finally:
            agent.kill(signal.SIGTERM)
    for proc in (operator, agent):
        records = _json_lines(proc)[before[proc.name] :]
        assert not [r for r in records if "exception" in r or "Traceback" in r["message"]], records
        assert not [r for r in records if r["level"] in ("ERROR", "CRITICAL")], records
        watches = _retries(records, " watch failed (")
        assert watches, proc.log_tail()
        assert {r["level"] for r in watches} == {"WARNING"}, watches
        # What failed, the fault in short (no answer: refused or cut), when it is retried.
        assert all(
            re.search(r" watch failed \(.+\); retrying in \d+\.\d s$", r["message"])
            for r in watches
        ), watches
    (refresh, *_) = _retries(_json_lines(operator), "webhook certificate refresh failed (")
    assert refresh["level"] == "WARNING", refresh
    assert refresh["message"].endswith("; retrying in 1.0 s"), refresh
