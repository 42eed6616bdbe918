"""The webhooks count what they answer: requests by webhook and outcome,
denials by a stable reason code, and the time each answer took."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from vnpu_common.wire import names
from vnpu_operator.admission import OfferedTemplates, create_app
from vnpu_operator.admission.charges import Charge
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.metrics import OperatorMetrics

PodFactory = Any


def _review(pod: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": pod,
        },
    }


class _Quotas(QuotaBook):
    """Refuses every charge, or fails reading the quotas."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail

    def exceeded(self, namespace: str, charge: Charge) -> str | None:
        if self.fail:
            raise RuntimeError("quota book broke")
        return f"namespace {namespace} is over its vNPU quota"


def _value(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def _post(metrics: OperatorMetrics, app_args: dict[str, Any], path: str, body: Any) -> int:
    async with TestClient(TestServer(create_app(metrics=metrics, **app_args))) as client:
        resp = await client.post(path, json=body)
        return resp.status


async def test_outcomes_and_denial_reasons_are_counted(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    synced: dict[str, Any] = {"offered": lambda: offered}
    mutate, validate = names.WEBHOOK_MUTATE_PATH, names.WEBHOOK_VALIDATE_PATH

    assert await _post(metrics, synced, mutate, _review(make_pod())) == 200
    assert await _post(metrics, synced, mutate, _review(make_pod(template="vir99"))) == 200
    assert await _post(metrics, synced, validate, _review(make_pod())) == 200  # not mutated
    starting = {"offered": lambda: None}
    assert await _post(metrics, starting, mutate, _review(make_pod())) == 200
    over = {"offered": lambda: offered, "quotas": _Quotas()}
    assert await _post(metrics, over, mutate, _review(make_pod())) == 200
    assert await _post(metrics, synced, mutate, {"kind": "Nonsense"}) == 400
    broken = {"offered": lambda: offered, "quotas": _Quotas(fail=True)}
    assert await _post(metrics, broken, mutate, _review(make_pod())) == 500

    requests = "vnpu_operator_admission_requests_total"
    assert _value(metrics, requests, webhook="mutate", outcome="allowed") == 1
    assert _value(metrics, requests, webhook="mutate", outcome="denied") == 3
    assert _value(metrics, requests, webhook="mutate", outcome="bad-request") == 1
    assert _value(metrics, requests, webhook="mutate", outcome="error") == 1
    assert _value(metrics, requests, webhook="validate", outcome="denied") == 1
    denials = "vnpu_operator_admission_denials_total"
    assert {
        (s.labels["webhook"], s.labels["reason"]): s.value
        for f in metrics.registry.collect()
        if f.name == denials.removesuffix("_total")
        for s in f.samples
        if s.name == denials
    } == {
        ("mutate", "invalid-request"): 1,
        ("mutate", "not-synced"): 1,
        ("mutate", "over-quota"): 1,
        ("validate", "not-mutated"): 1,
    }
    duration = "vnpu_operator_admission_duration_seconds_count"
    assert _value(metrics, duration, webhook="mutate") == 6
    assert _value(metrics, duration, webhook="validate") == 1


async def test_without_metrics_the_webhooks_still_answer(
    make_pod: PodFactory, offered: OfferedTemplates
) -> None:
    async with TestClient(TestServer(create_app(lambda: offered))) as client:
        resp = await client.post(names.WEBHOOK_MUTATE_PATH, json=_review(make_pod()))
        assert resp.status == 200
        assert (await resp.json())["response"]["allowed"] is True
