"""The components' command lines as an admin reads them: `--help` names
every flag's meaning, default, choices and environment variable, developer
flags stay out of it, and a bad value names both the flag and the variable."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings.sources.providers.cli import CLI_SUPPRESS

from vnpu_agent.config import AgentSettings
from vnpu_agent.config import parse_args as agent_args
from vnpu_common.process.flags import parse_settings
from vnpu_operator.config import OperatorSettings
from vnpu_operator.config import parse_args as operator_args

COMMANDS: list[tuple[str, type[BaseSettings], Callable[[list[str]], Any]]] = [
    ("vnpu-operator", OperatorSettings, operator_args),
    ("vnpu-agent", AgentSettings, agent_args),
]
IDS = [c[0] for c in COMMANDS]


def _help(parse: Callable[[list[str]], Any], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(["--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _hidden(field: FieldInfo) -> bool:
    return CLI_SUPPRESS in field.metadata


def _default(field: FieldInfo) -> str:
    return '""' if field.default == "" else str(field.default)


def _choices(field: FieldInfo) -> str | None:
    if get_origin(field.annotation) is Literal:
        return "{" + ",".join(str(c) for c in get_args(field.annotation)) + "}"
    return None


@pytest.mark.parametrize(("prog", "model", "parse"), COMMANDS, ids=IDS)
def test_help_explains_every_flag(
    prog: str,
    model: type[BaseSettings],
    parse: Callable[[list[str]], Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = _help(parse, capsys)
    assert text.startswith(f"usage: {prog} ")
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert not too_wide, too_wide
    # Each flag's entry: from its flag up to the next flag's line.
    flat = " ".join(text.split())
    visible = {name: f for name, f in model.model_fields.items() if not _hidden(f)}
    for name, field in visible.items():
        flag = "--" + name.replace("_", "-")
        env = "VNPU_" + name.upper()
        start = flat.index(f" {flag} ")
        entry = flat[start : flat.index("[env: ", start) + len(f"[env: {env}]")]
        assert field.description, f"{flag} has no description"
        assert " ".join(field.description.split()) in entry, entry
        assert f"(default: {_default(field)})" in entry, entry
        assert entry.endswith(f"[env: {env}]"), entry
        choices = _choices(field)
        if choices is not None:
            assert f"{flag} {choices}" in entry, entry


@pytest.mark.parametrize(
    ("parse", "argv", "setting", "expected"),
    [
        (operator_args, ["--webhook-url=https://h:9443"], "webhook_url", "https://h:9443"),
        (agent_args, ["--simulate-nodes=a,b"], "simulate_nodes", ["a", "b"]),
        (agent_args, ["--node-name=n", "--namespace=legacy"], "agent_namespace", "legacy"),
    ],
)
def test_developer_flags_are_hidden_but_accepted(
    parse: Callable[[list[str]], Any],
    argv: list[str],
    setting: str,
    expected: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hidden = argv[-1].split("=")[0]
    assert hidden not in _help(parse, capsys).split()
    assert getattr(parse(argv), setting) == expected


@pytest.mark.parametrize(("prog", "model", "parse"), COMMANDS, ids=IDS)
def test_version_prints_the_package_version(
    prog: str,
    model: type[BaseSettings],
    parse: Callable[[list[str]], Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"{prog} {version('vnpu-operator')}\n"


def _error(parse: Callable[[list[str]], Any], argv: list[str], capsys: Any) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    err: str = capsys.readouterr().err
    return err


def test_a_bad_flag_value_names_the_flag_and_its_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _error(operator_args, ["--converge-seconds=often"], capsys)
    assert (
        "vnpu-operator: error: --converge-seconds (VNPU_CONVERGE_SECONDS): "
        "Input should be a valid number, unable to parse string as a number (got 'often')"
    ) in err


def test_a_bad_environment_value_names_the_flag_and_its_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VNPU_LOG_FORMAT", "xml")
    err = _error(agent_args, ["--node-name=n"], capsys)
    assert "--log-format (VNPU_LOG_FORMAT): Input should be 'text' or 'json' (got 'xml')" in err


def test_every_bad_value_is_reported_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(operator_args, ["--max-attempts=0", "--webhook-port=0"], capsys)
    assert "--max-attempts (VNPU_MAX_ATTEMPTS)" in err
    assert "--webhook-port (VNPU_WEBHOOK_PORT)" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--max-attempt=2"], "unrecognized arguments: --max-attempt=2"),
        # An abbreviation is refused: a new flag could make it mean another.
        (["--kube=/k"], "unrecognized arguments: --kube=/k"),
        (["--policy"], "--policy: expected one argument"),
    ],
)
def test_a_malformed_command_line_is_refused(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in _error(operator_args, argv, capsys)


def test_an_undecodable_environment_variable_exits_cleanly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A complex setting pydantic-settings decodes as JSON from the environment
    (no such setting today, but nothing may turn it into a traceback)."""

    class Ports(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="VNPU_TEST_")
        ports: list[int] = []

    monkeypatch.setenv("VNPU_TEST_PORTS", "80,443")

    def parse(argv: list[str]) -> Ports:
        return parse_settings(Ports, argv, prog="test", description="test")

    assert 'error parsing value for field "ports"' in _error(parse, [], capsys)
    monkeypatch.setenv("VNPU_TEST_PORTS", "[80, 443]")
    assert parse([]).ports == [80, 443]
