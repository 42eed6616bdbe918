"""The chart's `helm test` script (charts/vnpu-operator/files/check_webhook.py) passes
only on a refusal by the vnpu-operator webhook for the probe's template, and names
what it saw otherwise. The answers below have the shapes the API server gives; the
plane test in tests/integration/test_chart_webhooks.py runs the script against real ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from vnpu_common.wire import names

SCRIPT = Path(__file__).resolve().parents[3] / "charts/vnpu-operator/files/check_webhook.py"
TEMPLATE = "no-such-template"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_webhook", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_its_names_are_the_operators(script: ModuleType) -> None:
    assert script.TEMPLATE_ANNOTATION == names.ANN_TEMPLATE
    assert set(script.WEBHOOKS) == {names.WEBHOOK_MUTATE_NAME, names.WEBHOOK_VALIDATE_NAME}
    pod = script.probe_pod(TEMPLATE)
    assert pod["metadata"]["annotations"] == {names.ANN_TEMPLATE: TEMPLATE}


def _denied(webhook: str, why: str) -> dict[str, object]:
    return {
        "kind": "Status",
        "status": "Failure",
        "reason": "Invalid",
        "code": 422,
        "message": f'admission webhook "{webhook}" denied the request: {why}',
    }


@pytest.mark.parametrize("webhook", [names.WEBHOOK_MUTATE_NAME, names.WEBHOOK_VALIDATE_NAME])
def test_a_refusal_for_the_template_passes(script: ModuleType, webhook: str) -> None:
    why = f'vnpu.io/template "{TEMPLATE}" is not offered by any node; offered: 910B3: vir05'
    passed, verdict = script.judge(422, _denied(webhook, why), TEMPLATE)
    assert passed is True
    assert verdict.startswith(f"webhook {webhook} refused a pod naming {TEMPLATE}")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (201, {"kind": "Pod"}, "was admitted (dry run): no vnpu-operator webhook refused it"),
        (
            500,
            {
                "message": 'Internal error occurred: failed calling webhook "mutate.pods.vnpu.io": '
                'failed to call webhook: Post "https://vnpu-operator-webhook.ns.svc:443/mutate'
                '?timeout=5s": dial tcp 10.0.0.12:443: connect: connection refused'
            },
            "the vnpu-operator webhook did not answer (HTTP 500)",
        ),
        (
            403,
            {
                "message": 'pods is forbidden: User "system:serviceaccount:ns:t" cannot create '
                'resource "pods" in API group "" in the namespace "ns"'
            },
            "refused before the webhook judged it (HTTP 403)",
        ),
        (
            422,
            _denied(names.WEBHOOK_MUTATE_NAME, "over quota vnpu.io/vnpus in namespace ns"),
            "refused the pod, but not for its template",
        ),
        # Another admission webhook's refusal is not ours.
        (
            403,
            _denied("policy.example.com", f"pods may not name {TEMPLATE}"),
            "refused before the webhook judged it",
        ),
        (502, "<html>bad gateway</html>", "refused before the webhook judged it (HTTP 502)"),
    ],
)
def test_anything_else_fails_and_says_what_happened(
    script: ModuleType, status: int, body: object, expected: str
) -> None:
    passed, verdict = script.judge(status, body, TEMPLATE)
    assert passed is False
    assert expected in verdict, verdict
