"""The Mutating- and ValidatingWebhookConfiguration objects of the webhooks."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from vnpu_common.wire import names

REGISTRATION_API_VERSION: Final = "admissionregistration.k8s.io/v1"
TIMEOUT_SECONDS: Final = 5
# Only pods that ask for vNPUs reach the webhook, so an operator outage under
# failurePolicy Fail blocks those pods and no others (the operator's own included).
# ... by annotation, or by naming vnpu.io/<template> in a container's resources
# (admission.limits). The regular expression is names.TEMPLATE_PATTERN's, under
# vnpu.io/ ("[.]": no backslash to escape in CEL or YAML).
TEMPLATE_RESOURCE_REGEX: Final = "^vnpu[.]io/" + names.TEMPLATE_PATTERN.removeprefix("^")
MATCH_EXPRESSION: Final = (
    f"(has(object.metadata.annotations) && '{names.ANN_TEMPLATE}' in object.metadata.annotations)"
    " || (object.spec.containers + object.spec.?initContainers.orValue([])).exists(c, "
    f"c.?resources.?limits.orValue({{}}).exists(k, k.matches('{TEMPLATE_RESOURCE_REGEX}')) || "
    f"c.?resources.?requests.orValue({{}}).exists(k, k.matches('{TEMPLATE_RESOURCE_REGEX}')))"
)


@dataclass(frozen=True)
class ServiceRef:
    """The in-cluster Service in front of the operator's webhook server."""

    namespace: str
    name: str
    port: int = 443


# A base https URL ("https://10.0.0.1:9443") or a Service; the paths are appended.
WebhookTarget = str | ServiceRef


def mutating_webhook_configuration(target: WebhookTarget, ca_pem: bytes | None) -> dict[str, Any]:
    webhook = _webhook(names.WEBHOOK_MUTATE_NAME, target, names.WEBHOOK_MUTATE_PATH, ca_pem)
    # kubectl debug adds containers through this subresource: theirs is an empty device
    # list, set here, or their image or envFrom could name any vNPU of the node.
    webhook["rules"].append(_rule("UPDATE", "pods/ephemeralcontainers"))
    # Another webhook changing the pod after us (e.g. its env) gets us called again.
    webhook["reinvocationPolicy"] = "IfNeeded"
    return _configuration("MutatingWebhookConfiguration", webhook)


def validating_webhook_configuration(target: WebhookTarget, ca_pem: bytes | None) -> dict[str, Any]:
    webhook = _webhook(names.WEBHOOK_VALIDATE_NAME, target, names.WEBHOOK_VALIDATE_PATH, ca_pem)
    return _configuration("ValidatingWebhookConfiguration", webhook)


def client_config(target: WebhookTarget, path: str, ca_pem: bytes | None) -> dict[str, Any]:
    """`ca_pem` None or empty: the API server's own trust roots verify the server."""
    config: dict[str, Any]
    if isinstance(target, ServiceRef):
        if not 1 <= target.port <= 65535:
            raise ValueError(f"service port {target.port} is not in 1..65535")
        service = {"namespace": target.namespace, "name": target.name}
        config = {"service": {**service, "path": path, "port": target.port}}
    else:
        config = {"url": _url(target, path)}
    if ca_pem:
        config["caBundle"] = base64.b64encode(ca_pem).decode("ascii")
    return config


def keep_ca_bundles(body: dict[str, Any], existing: dict[str, Any]) -> dict[str, Any]:
    """`body` with the caBundle of `existing`'s same-named webhook wherever `body` has none.

    Registering a configuration replaces its whole `webhooks` list; a caBundle that
    cert-manager's cainjector (or an admin) put there would be wiped by a body whose
    CA the operator does not know.
    """
    have = {
        w.get("name"): (w.get("clientConfig") or {}).get("caBundle")
        for w in existing.get("webhooks") or []
    }
    webhooks = []
    for webhook in body["webhooks"]:
        injected = have.get(webhook["name"])
        if injected and not webhook["clientConfig"].get("caBundle"):
            webhook = {**webhook, "clientConfig": {**webhook["clientConfig"], "caBundle": injected}}
        webhooks.append(webhook)
    return {**body, "webhooks": webhooks}


def merge_ca_bundles(
    body: dict[str, Any], existing: dict[str, Any], merge: Callable[[bytes, bytes | None], bytes]
) -> dict[str, Any]:
    """`body` with each caBundle it has replaced by `merge(ours, theirs)`, theirs the
    same-named webhook's caBundle in `existing` (PEM, None if it has none)."""
    have = {
        w.get("name"): (w.get("clientConfig") or {}).get("caBundle")
        for w in existing.get("webhooks") or []
    }
    webhooks = []
    for webhook in body["webhooks"]:
        ours = webhook["clientConfig"].get("caBundle")
        if ours:
            theirs = have.get(webhook["name"])
            pem = merge(base64.b64decode(ours), base64.b64decode(theirs) if theirs else None)
            config = {**webhook["clientConfig"], "caBundle": base64.b64encode(pem).decode()}
            webhook = {**webhook, "clientConfig": config}
        webhooks.append(webhook)
    return {**body, "webhooks": webhooks}


def _url(base: str, path: str) -> str:
    # The API server rejects anything but https without user info, query or fragment.
    parts = urlsplit(base)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"webhook URL {base!r} must be https://host[:port]")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"webhook URL {base!r} must have no user info, query or fragment")
    return base.rstrip("/") + path


def _webhook(name: str, target: WebhookTarget, path: str, ca_pem: bytes | None) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": client_config(target, path, ca_pem),
        "rules": [_rule("CREATE", "pods")],
        "matchConditions": [{"name": "requests-vnpu", "expression": MATCH_EXPRESSION}],
        "matchPolicy": "Equivalent",
        # Pods that ask for vNPUs must not slip through without gate and finalizer.
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
    }


def _rule(operation: str, resource: str) -> dict[str, Any]:
    return {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": [operation],
        "resources": [resource],
        "scope": "Namespaced",
    }


def _configuration(kind: str, webhook: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": REGISTRATION_API_VERSION,
        "kind": kind,
        "metadata": {"name": names.WEBHOOK_CONFIG_NAME},
        "webhooks": [webhook],
    }
