"""Admission of pods that ask for vNPUs: parsing, validation, mutation, webhook server.

Its parts by layer, top to bottom (a layers contract of its own in pyproject.toml),
so the verdicts the controller shares know no server:

- `server`: TLS, the webhook configurations registered, the certificate kept current.
- `webhook`: the aiohttp app: AdmissionReview in and out, a 400 or 500, never a
  dead server.
- `configurations`: the Mutating- and ValidatingWebhookConfiguration objects.
- `certs`: where the serving certificate comes from (made in memory, or a
  mounted directory), and when it changes.
- `decisions`: the verdicts for one pod and the DENIED_* codes (pure).
- `mutation`: what the mutating webhook adds, as RFC 6902 ops; empty once in place.
- `validation`: the checks of a pod's request, one message per problem.
- `quotas`: a pod refused in our words when its namespace's quota shows it
  cannot fit.
- `limits`: `limits: {vnpu.io/<template>: N}` on every cluster: left to DRA
  where a node offers it, else turned into the annotations.
- `charges`: the extended resources a pod is charged, so that quota counts it.
- `offered`: which templates the cluster offers, per chip model.
"""

from vnpu_operator.admission.configurations import (
    ServiceRef,
    mutating_webhook_configuration,
    validating_webhook_configuration,
)
from vnpu_operator.admission.mutation import mutate_pod
from vnpu_operator.admission.offered import OfferedTemplates
from vnpu_operator.admission.validation import validate_pod
from vnpu_operator.admission.webhook import create_app
from vnpu_operator.annotations import (
    AdmissionError,
    AnnotationError,
    VNPURequest,
    parse_request,
    requests_vnpus,
)

__all__ = [
    "AdmissionError",
    "AnnotationError",
    "OfferedTemplates",
    "ServiceRef",
    "VNPURequest",
    "create_app",
    "mutate_pod",
    "mutating_webhook_configuration",
    "parse_request",
    "requests_vnpus",
    "validate_pod",
    "validating_webhook_configuration",
]
