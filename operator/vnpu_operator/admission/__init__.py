"""Admission of pods that ask for vNPUs: parsing, validation, mutation, webhook server."""

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
