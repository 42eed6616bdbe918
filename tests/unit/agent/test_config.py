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
        (["--node-name", "n", "--driver", "gpu"], "driver"),
        (["--node-name", "n", "--gc-grace-seconds", "-1"], "gc_grace_seconds"),
        (["--node-name", "n", "--metrics-port", "70000"], "metrics_port"),
        (["--node-name", "n", "--foreign-vnpu-policy", "destroy"], "foreign_vnpu_policy"),
        ([], "node_name is required"),
        (["--simulate-nodes", "a", "--driver", "dcmi"], "simulate_nodes needs driver=sim"),
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
