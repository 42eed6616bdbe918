"""The webhook configuration objects the operator registers."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from vnpu_common.wire import names
from vnpu_operator.admission import (
    ServiceRef,
    mutating_webhook_configuration,
    validating_webhook_configuration,
)

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _only_webhook(config: dict[str, Any]) -> dict[str, Any]:
    (webhook,) = config["webhooks"]
    assert isinstance(webhook, dict)
    return webhook


def test_mutating_configuration_with_service() -> None:
    config = mutating_webhook_configuration(ServiceRef("vnpu-system", "vnpu-operator", 9443), CA)
    assert config["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert config["kind"] == "MutatingWebhookConfiguration"
    assert config["metadata"] == {"name": "vnpu-operator"}
    assert _only_webhook(config) == {
        "name": "mutate.pods.vnpu.io",
        "clientConfig": {
            "service": {
                "namespace": "vnpu-system",
                "name": "vnpu-operator",
                "path": "/mutate",
                "port": 9443,
            },
            "caBundle": base64.b64encode(CA).decode(),
        },
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            },
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["pods/ephemeralcontainers"],
                "scope": "Namespaced",
            },
        ],
        "matchConditions": [
            {
                "name": "requests-vnpu",
                # By annotation, or by vnpu.io/<template> in a container's resources.
                "expression": "(has(object.metadata.annotations) && "
                "'vnpu.io/template' in object.metadata.annotations) || "
                "(object.spec.containers + object.spec.?initContainers.orValue([])).exists(c, "
                "c.?resources.?limits.orValue({}).exists(k, "
                "k.matches('^vnpu[.]io/vir[0-9]{2}(_[0-9a-z]+)*$')) || "
                "c.?resources.?requests.orValue({}).exists(k, "
                "k.matches('^vnpu[.]io/vir[0-9]{2}(_[0-9a-z]+)*$')))",
            }
        ],
        "matchPolicy": "Equivalent",
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "admissionReviewVersions": ["v1"],
        "reinvocationPolicy": "IfNeeded",
    }


def test_validating_configuration_with_url() -> None:
    config = validating_webhook_configuration("https://127.0.0.1:9443/", CA)
    assert config["kind"] == "ValidatingWebhookConfiguration"
    assert config["metadata"]["name"] == names.WEBHOOK_CONFIG_NAME
    webhook = _only_webhook(config)
    assert webhook["name"] == names.WEBHOOK_VALIDATE_NAME
    assert webhook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate",
        "caBundle": base64.b64encode(CA).decode(),
    }
    assert "reinvocationPolicy" not in webhook
    assert webhook["rules"][0]["operations"] == ["CREATE"]
    assert webhook["failurePolicy"] == "Fail"


def test_webhook_names_are_fully_qualified() -> None:
    # The API server requires at least three dot-separated segments.
    for name in (names.WEBHOOK_MUTATE_NAME, names.WEBHOOK_VALIDATE_NAME):
        assert len(name.split(".")) >= 3


def test_no_ca_means_system_roots() -> None:
    webhook = _only_webhook(mutating_webhook_configuration("https://webhook.example.com", None))
    assert webhook["clientConfig"] == {"url": "https://webhook.example.com/mutate"}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9443",
        "https://",
        "127.0.0.1:9443",
        "https://user:pw@host:9443",
        "https://host:9443?x=1",
        "https://host:9443#frag",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="webhook URL"):
        mutating_webhook_configuration(url, CA)


@pytest.mark.parametrize("port", [0, 65536])
def test_bad_service_port_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match=r"not in 1\.\.65535"):
        validating_webhook_configuration(ServiceRef("ns", "svc", port), CA)
