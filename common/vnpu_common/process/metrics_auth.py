"""Authenticated /metrics: who may scrape is decided by the API server.

A scraper sends its ServiceAccount token as a bearer token. The API server says
whose it is (TokenReview) and whether that user may `get` the non-resource URL
/metrics (SubjectAccessReview): the check kube-rbac-proxy and controller-runtime's
authenticated metrics make, so the same ClusterRole grants a scrape of either.
Answers are kept a short while per token, so that a scrape every few seconds
costs the API server two reviews a minute, not two a scrape. The port is TLS with a
certificate made at start (a scraper skips verification, as for the kubelet's own
metrics): the token must not cross the network in clear.
"""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.faults import fault

# A refused or granted token is asked again after this long: a revoked binding
# stops a scraper within a minute.
CACHE_SECONDS = 60.0
# Distinct tokens remembered; a flood of made-up tokens only costs reviews.
CACHE_ENTRIES = 256
METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class Verdict:
    """An HTTP status (200, 401, 403 or 503) and why, for the scraper."""

    status: int
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


Review = Callable[[str], Awaitable[Verdict]]


def api_review(api_client: client.ApiClient, path: str = METRICS_PATH) -> Review:
    """TokenReview, then SubjectAccessReview of `get` on `path`, for a token."""
    authn = client.AuthenticationV1Api(api_client)
    authz = client.AuthorizationV1Api(api_client)

    async def review(token: str) -> Verdict:
        try:
            reviewed: Any = await authn.create_token_review(
                client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
            )
            status = reviewed.status
            if status is None or not status.authenticated or status.user is None:
                return Verdict(401, "the token is not valid")
            user = status.user
            access: Any = await authz.create_subject_access_review(
                client.V1SubjectAccessReview(
                    spec=client.V1SubjectAccessReviewSpec(
                        user=user.username,
                        groups=user.groups,
                        uid=user.uid,
                        extra=user.extra,
                        non_resource_attributes=client.V1NonResourceAttributes(
                            path=path, verb="get"
                        ),
                    )
                )
            )
        except (ApiException, OSError, TimeoutError) as exc:
            return Verdict(503, f"the API server did not review the token ({fault(exc)})")
        if access.status is not None and access.status.allowed:
            return Verdict(200, "allowed")
        return Verdict(403, f"{user.username} may not get {path}")

    return review


class TokenCheck:
    """Bearer token -> Verdict, each answer kept CACHE_SECONDS (a 503 is not kept)."""

    def __init__(
        self,
        review: Review,
        *,
        ttl: float = CACHE_SECONDS,
        entries: int = CACHE_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._review = review
        self._ttl = ttl
        self._entries = entries
        self._clock = clock
        self._kept: dict[str, tuple[float, Verdict]] = {}

    async def check(self, authorization: str | None) -> Verdict:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Verdict(401, "a bearer token is required")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        kept = self._kept.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        verdict = await self._review(token)
        if verdict.status != 503:
            if len(self._kept) >= self._entries:
                self._kept = {k: v for k, v in self._kept.items() if v[0] > now}
                if len(self._kept) >= self._entries:
                    self._kept.pop(next(iter(self._kept)))
            self._kept[key] = (now + self._ttl, verdict)
        return verdict


def self_signed_context(component: str) -> ssl.SSLContext:
    """A server TLS context with a certificate for this host, made now. The PEMs
    go through anonymous memory files: the agent's root filesystem is read-only."""
    # Imported here: `cryptography` is 8 MB of every agent's memory, and only
    # metrics_auth=kubernetes without a certificate of the admin's needs it.
    from vnpu_common.kube import certs

    ca = certs.make_ca(f"{component}-metrics-ca")
    host = socket.gethostname()
    pair = certs.issue(ca, host, dns_names=(host, "localhost"), ip_addresses=("127.0.0.1",))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert_fd, key_fd = os.memfd_create("metrics-cert"), os.memfd_create("metrics-key")
    try:
        os.write(cert_fd, pair.cert_pem + ca.cert_pem)
        os.write(key_fd, pair.key_pem)
        context.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
    finally:
        os.close(cert_fd)
        os.close(key_fd)
    return context
