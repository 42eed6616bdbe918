"""HTTP side of the admission webhooks: AdmissionReview (admission.k8s.io/v1) in and out.

The decisions are plain functions (admission.decisions); the aiohttp handlers
only decode, guard and encode, so a malformed review gets a 400 and an
unexpected error a 500, never a dead server.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson
from aiohttp import web

from vnpu_common.wire import names
from vnpu_operator.admission.charges import Charge
from vnpu_operator.admission.decisions import (
    DENIED_INVALID,
    NO_ROUTING,
    Decision,
    OverQuota,
    decide_mutation,
    decide_validation,
)
from vnpu_operator.admission.limits import Routing
from vnpu_operator.admission.mutation import mutate_ephemeral
from vnpu_operator.admission.offered import OfferedTemplates
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.annotations import AdmissionError

if TYPE_CHECKING:
    from vnpu_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)

ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"
ADMISSION_KIND: Final = "AdmissionReview"
# A pod of many containers stays far below this; the API server caps objects at ~3 MiB.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024

# Returns what the cluster offers now, or None while the operator's inventory is
# not synced yet (see validate_pod).
OfferedSource = Callable[[], OfferedTemplates | None]


def create_app(
    offered: OfferedSource,
    *,
    runtime_class_name: str = "",
    quotas: QuotaBook | None = None,
    metrics: OperatorMetrics | None = None,
    routing: Routing = NO_ROUTING,
) -> web.Application:
    """POST /mutate, POST /validate, GET /healthz. TLS is the caller's: the
    API server only calls https endpoints. `runtime_class_name`: see mutate_pod;
    `quotas`: the namespaces' vNPU quotas, to refuse a pod that exceeds one;
    `metrics`: where requests, denials and answer times are counted; `routing`:
    where a vnpu.io/<template> request goes (admission.limits)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    hooks = _Hooks(offered, runtime_class_name, quotas or QuotaBook(), metrics, routing)
    app.router.add_post(names.WEBHOOK_MUTATE_PATH, hooks.mutate)
    app.router.add_post(names.WEBHOOK_VALIDATE_PATH, hooks.validate)
    app.router.add_get(names.WEBHOOK_HEALTH_PATH, _healthz)
    return app


class BadReviewError(ValueError):
    """The body is not an AdmissionReview we can answer."""


@dataclass(frozen=True)
class ReviewRequest:
    """The parts of AdmissionReview.request the webhooks read."""

    uid: str
    namespace: str
    operation: str
    kind: str
    sub_resource: str
    obj: Any
    old: Any = None


Decide = Callable[[Mapping[str, Any], OfferedTemplates | None, str, OverQuota, Routing], Decision]


class _Hooks:
    def __init__(
        self,
        offered: OfferedSource,
        runtime_class_name: str,
        quotas: QuotaBook,
        metrics: OperatorMetrics | None,
        routing: Routing = NO_ROUTING,
    ) -> None:
        self._offered = offered
        self._routing = routing
        self._runtime_class_name = runtime_class_name
        self._quotas = quotas
        self._metrics = metrics

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._measured("mutate", request, decide_mutation, mutates=True)

    async def validate(self, request: web.Request) -> web.Response:
        return await self._measured("validate", request, decide_validation, mutates=False)

    async def _measured(
        self, webhook: str, request: web.Request, decide: Decide, *, mutates: bool
    ) -> web.Response:
        start = time.perf_counter()
        response, outcome, reason = await self._handle(request, decide, mutates)
        if self._metrics is not None:
            self._metrics.admission_duration.labels(webhook).observe(time.perf_counter() - start)
            self._metrics.admission_requests.labels(webhook, outcome).inc()
            if reason:
                self._metrics.admission_denials.labels(webhook, reason).inc()
        return response

    async def _handle(
        self, request: web.Request, decide: Decide, mutates: bool
    ) -> tuple[web.Response, str, str]:
        """The answer, its outcome (allowed, denied, bad-request, error) and
        the denial's reason code."""
        try:
            review = parse_review(await request.read())
        except BadReviewError as exc:
            return web.Response(status=400, text=f"bad AdmissionReview: {exc}\n"), "bad-request", ""
        try:
            decision = self._decide(review, decide, mutates)
        except Exception:
            log.exception("admission of review %s failed", review.uid)
            error = web.Response(status=500, text="internal error; see the vnpu-operator log\n")
            return error, "error", ""
        answer = web.Response(
            body=orjson.dumps(review_response(review.uid, decision)),
            content_type="application/json",
        )
        if not decision.allowed:
            log.info(
                "denied pod %s/%s (review %s): %s",
                review.namespace or "?",
                _pod_name(review.obj),
                review.uid,
                "; ".join(decision.problems),
            )
            return answer, "denied", decision.reason or "other"
        return answer, "allowed", ""

    def _decide(self, review: ReviewRequest, decide: Decide, mutates: bool) -> Decision:
        if (
            mutates
            and review.kind == "Pod"
            and review.operation == "UPDATE"
            and review.sub_resource == "ephemeralcontainers"
        ):
            # kubectl debug on a vNPU pod: the new container's device list is ours too.
            try:
                return Decision(allowed=True, patch=mutate_ephemeral(review.obj, review.old))
            except AdmissionError as exc:
                return Decision(allowed=False, problems=list(exc.problems), reason=DENIED_INVALID)
        # Only pod creation is ours otherwise; anything else the configuration let through
        # by mistake passes untouched rather than failing closed on foreign objects.
        if review.operation != "CREATE" or review.kind != "Pod" or review.sub_resource:
            return Decision(allowed=True)
        namespace = review.namespace

        def over_quota(charge: Charge) -> str | None:
            return self._quotas.exceeded(namespace, charge)

        return decide(
            review.obj, self._current_offer(), self._runtime_class_name, over_quota, self._routing
        )

    def _current_offer(self) -> OfferedTemplates | None:
        try:
            return self._offered()
        except Exception:
            # Checks against the cluster are skipped, as while the inventory syncs;
            # placement still refuses templates nobody offers.
            log.exception("reading the offered templates failed")
            return None


def parse_review(body: bytes) -> ReviewRequest:
    """Raises BadReviewError naming the first thing wrong with the body."""
    try:
        doc = orjson.loads(body)
    except ValueError as exc:  # includes UnicodeDecodeError
        raise BadReviewError(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadReviewError("body is not a JSON object")
    if doc.get("apiVersion") != ADMISSION_API_VERSION or doc.get("kind") != ADMISSION_KIND:
        raise BadReviewError(
            f"expected apiVersion {ADMISSION_API_VERSION} kind {ADMISSION_KIND}, got "
            f"{doc.get('apiVersion')!r} {doc.get('kind')!r}"
        )
    req = doc.get("request")
    if not isinstance(req, dict):
        raise BadReviewError("request is missing")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReviewError("request.uid is missing")
    kind = req.get("kind")
    operation = req.get("operation")
    sub_resource = req.get("subResource") or ""
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise BadReviewError("request.kind is missing")
    if not isinstance(operation, str) or not isinstance(sub_resource, str):
        raise BadReviewError("request.operation is missing")
    obj = req.get("object")
    if operation == "CREATE" and not isinstance(obj, dict):
        raise BadReviewError("request.object of a CREATE is not an object")
    if operation == "UPDATE" and not isinstance(obj, dict):
        raise BadReviewError("request.object of an UPDATE is not an object")
    namespace = req.get("namespace")
    namespace = namespace if isinstance(namespace, str) else ""
    old = req.get("oldObject")
    return ReviewRequest(
        uid, namespace, operation, kind["kind"], sub_resource, obj,
        old if isinstance(old, dict) else None,
    )  # fmt: skip


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": "\n".join(decision.problems),
        }
    if decision.patch:
        patch = orjson.dumps(decision.patch)
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode("ascii")
    return {"apiVersion": ADMISSION_API_VERSION, "kind": ADMISSION_KIND, "response": response}


def _pod_name(pod: object) -> str:
    # At creation a pod may have only generateName; the API server names it later.
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(metadata, dict):
        return "?"
    return str(metadata.get("name") or f"{metadata.get('generateName') or ''}*")


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")
