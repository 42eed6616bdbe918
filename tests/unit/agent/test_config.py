"""Agent settings: flags over VNPU_* environment, clear errors for bad values."""

from __future__ import annotations

import pytest

from vnpu_agent.config import AgentSettings, parse_args


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VNPU_NODE_NAME", "from-env")
    monkeypatch.setenv("VNPU_GC_GRACE_SECONDS", "30")
    s = parse_args(["--node-name", "from-flag"])
    assert s.node_name == "from-flag"
    assert s.gc_grace_seconds == 30
    assert s.nodes == ["from-flag"]


def test_simulated_nodes_from_a_comma_list() -> None:
    s = parse_args(["--simulate-nodes", "a, b,,c"])
    assert s.nodes == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node-name", "n", "--driver", "gpu"], "--driver (VNPU_DRIVER)"),
        (["--node-name", "n", "--gc-grace-seconds", "-1"], "--gc-grace-seconds"),
        (["--node-name", "n", "--metrics-port", "70000"], "--metrics-port (VNPU_METRICS_PORT)"),
        (["--node-name", "n", "--foreign-vnpu-policy", "destroy"], "--foreign-vnpu-policy"),
        ([], "--node-name (VNPU_NODE_NAME) is required"),
        (["--simulate-nodes", "a", "--driver", "dcmi"], "--simulate-nodes needs --driver=sim"),
    ],
)
def test_bad_values_exit_with_the_setting_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_environment_alone_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VNPU_NODE_NAME", "n1")
    monkeypatch.setenv("VNPU_DRIVER", "npu-smi")
    assert AgentSettings().driver == "npu-smi"


def test_simulated_nodes_from_the_environment_as_a_comma_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VNPU_SIMULATE_NODES", "a, b")
    assert parse_args([]).nodes == ["a", "b"]


def test_agent_namespace_has_one_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args(["--node-name=n"]).agent_namespace == "vnpu-system"
    monkeypatch.setenv("VNPU_AGENT_NAMESPACE", "ops")
    s = parse_args(["--node-name=n"])
    assert (s.agent_namespace, s.deprecations()) == ("ops", [])
    assert parse_args(["--node-name=n", "--agent-namespace=infra"]).agent_namespace == "infra"


@pytest.mark.parametrize(
    ("argv", "env"),
    [(["--namespace=legacy"], {}), ([], {"VNPU_NAMESPACE": "legacy"})],
)
def test_the_old_namespace_name_still_works_with_a_warning(
    argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = parse_args(["--node-name=n", *argv])
    assert s.agent_namespace == "legacy"
    (warning,) = s.deprecations()
    assert "--namespace / VNPU_NAMESPACE is deprecated" in warning
    assert "--agent-namespace / VNPU_AGENT_NAMESPACE" in warning


def test_old_and_new_namespace_names_that_disagree_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VNPU_NAMESPACE", "old")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--node-name=n", "--agent-namespace=new"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--agent-namespace (new)" in err
    assert "VNPU_NAMESPACE (old) disagree" in err
    # Both naming the same namespace is no conflict.
    assert parse_args(["--node-name=n", "--agent-namespace=old"]).agent_namespace == "old"


def test_driver_defaults_to_the_charts_and_to_sim_for_simulated_nodes() -> None:
    """A node's agent defaults to dcmi, as the chart's agent.view.driver does; the
    demo's and benchmarks' --simulate-nodes imply sim."""
    assert parse_args(["--node-name=n"]).driver == "dcmi"
    assert parse_args(["--simulate-nodes=a,b"]).driver == "sim"
    assert AgentSettings(simulate_nodes=["a"]).driver == "sim"
