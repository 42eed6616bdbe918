"""Operator settings: flags over environment, clear errors."""

from __future__ import annotations

import pytest

from vnpu_operator.admission.server import parse_service, webhook_target
from vnpu_operator.config import parse_args
from vnpu_operator.placement import Policy


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VNPU_POLICY", "spread")
    monkeypatch.setenv("VNPU_MAX_ATTEMPTS", "5")
    settings = parse_args(["--max-attempts=2", "--webhook-dns-names=a.example, b.example"])
    assert settings.placement_policy is Policy.SPREAD
    assert settings.max_attempts == 2
    assert settings.webhook_dns_names == ["a.example", "b.example"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--policy=random"],
            "--policy (VNPU_POLICY): Input should be 'binpack', 'spread' or 'bestfit'",
        ),
        (["--max-attempts=0"], "--max-attempts (VNPU_MAX_ATTEMPTS)"),
        (["--webhook-url=https://x", "--webhook-service=ns/svc"], "not both"),
        (["--webhook-service=svc"], "namespace/name[:port], not 'svc'"),
    ],
)
def test_bad_values_exit_naming_the_setting(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert needle in capsys.readouterr().err


def test_webhook_targets() -> None:
    assert webhook_target(parse_args(["--webhook-url=https://127.0.0.1:9443"])) == (
        "https://127.0.0.1:9443"
    )
    service = parse_service("vnpu-system/vnpu-operator-webhook:8443")
    assert (service.namespace, service.name, service.port) == (
        "vnpu-system",
        "vnpu-operator-webhook",
        8443,
    )
    assert parse_service("ns/name").port == 443
    assert webhook_target(parse_args([])) is None
    with pytest.raises(ValueError, match="namespace/name"):
        parse_service("/name")


def test_runtime_class_name_is_off_by_default_and_settable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_args([]).runtime_class_name == ""
    monkeypatch.setenv("VNPU_RUNTIME_CLASS_NAME", "ascend")
    assert parse_args([]).runtime_class_name == "ascend"
    assert parse_args(["--runtime-class-name=kata"]).runtime_class_name == "kata"


def test_the_lease_poll_interval_is_ignored_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Leases are watched now; an install that still sets the interval keeps working.
    assert parse_args([]).deprecations() == []
    (warning,) = parse_args(["--lease-poll-seconds=5"]).deprecations()
    assert "--lease-poll-seconds / VNPU_LEASE_POLL_SECONDS is ignored" in warning
    monkeypatch.setenv("VNPU_LEASE_POLL_SECONDS", "2")
    assert len(parse_args([]).deprecations()) == 1
