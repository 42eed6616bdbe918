"""Serves the admission webhooks over TLS, registers their configurations and keeps
the served certificate current.

Certificates come from a directory (a mounted Secret, e.g. cert-manager's: files that
change are served without a restart) or are made in memory (a CA and a certificate
for the loopback address and the Service's DNS names, each renewed well before it
expires). With its own CA the operator must register the configurations itself,
since only it knows the CA bundle; a CA bundle it does not know (injected by
cert-manager's cainjector) is left in place.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from aiohttp import hdrs, web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.faults import log_retry
from vnpu_common.wire import names
from vnpu_common.wire.patches import MERGE
from vnpu_operator.admission import (
    ServiceRef,
    mutating_webhook_configuration,
    validating_webhook_configuration,
)
from vnpu_operator.admission.certs import (
    CertDir,
    CertError,
    Material,
    SelfSigned,
    covers,
    handover,
    load,
)
from vnpu_operator.admission.configurations import (
    WebhookTarget,
    keep_ca_bundles,
    merge_ca_bundles,
)
from vnpu_operator.admission.limits import Routing
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.admission.webhook import OfferedSource, create_app
from vnpu_operator.config import OperatorSettings
from vnpu_operator.metrics import OperatorMetrics

# The logger keeps its name from before the move into admission/: log lines read as before.
log = logging.getLogger("vnpu_operator.webhook_server")

# After a new CA bundle is registered and before a certificate of the new CA is served:
# API servers see configuration changes through a watch, a moment later.
HANDOVER_SECONDS: Final = 2.0
# CAs kept in a caBundle: each replica with operator-made certificates has its own CA
# (and one more during a renewal's handover); each registers its own first.
MAX_CAS: Final = 8
# Read-modify-write of a configuration that someone else (cainjector) also writes.
CONFLICT_ATTEMPTS: Final = 5

Build = Callable[[WebhookTarget, bytes | None], dict[str, Any]]


def parse_service(text: str) -> ServiceRef:
    """ "ns/name" or "ns/name:port"."""
    namespace, _, rest = text.partition("/")
    name, _, port = rest.partition(":")
    if not namespace or not name:
        raise ValueError(f"webhook service {text!r} must be namespace/name[:port]")
    return ServiceRef(namespace=namespace, name=name, port=int(port) if port else 443)


def webhook_target(settings: OperatorSettings) -> WebhookTarget | None:
    if settings.webhook_url:
        return settings.webhook_url
    if settings.webhook_service:
        return parse_service(settings.webhook_service)
    return None


def certificate_source(settings: OperatorSettings) -> SelfSigned | CertDir:
    s = settings
    if s.webhook_cert_dir is not None:
        return CertDir(s.webhook_cert_dir)
    dns = [*s.webhook_dns_names, "localhost"]
    target = webhook_target(s)
    if isinstance(target, ServiceRef):
        svc = f"{target.name}.{target.namespace}"
        dns += [svc, f"{svc}.svc", f"{svc}.svc.cluster.local"]
    return SelfSigned(
        tuple(dns), ("127.0.0.1",),
        validity=s.webhook_cert_validity_seconds, ca_validity=s.webhook_ca_validity_seconds,
        renew_fraction=s.webhook_cert_renew_fraction,
    )  # fmt: skip


def _merge_cas(ours: bytes, theirs: bytes | None) -> bytes:
    return handover(ours, theirs, time.time(), limit=MAX_CAS)


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")


class WebhookServer:
    def __init__(
        self,
        settings: OperatorSettings,
        offered: OfferedSource,
        quotas: QuotaBook,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.offered = offered
        self.quotas = quotas
        # Where the webhooks count requests, denials and answer times.
        self.metrics = metrics
        self._source: SelfSigned | CertDir | None = None
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._not_after: float | None = None
        # The CA bundle in the configurations as the operator last registered it.
        self._registered: bytes | None = None
        # Material the source handed out that is not served yet (its CA bundle could
        # not be registered); tried again each poll.
        self._pending: Material | None = None
        self._api_client: client.ApiClient | None = None
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="vnpu-webhook-")
        self._draining = False

    @property
    def draining(self) -> bool:
        """Whether the replica is stopping: not Ready, each answer its connection's last."""
        return self._draining

    def cert_not_after(self) -> float | None:
        """Epoch seconds of the served leaf's notAfter; None before the server has one."""
        return self._not_after

    async def start(self) -> None:
        try:
            self._source = certificate_source(self.settings)
            material = self._source.current()
            load(self._context, material, Path(self._tmp.name))
        except CertError as exc:
            # A start-time configuration error: one clear line, not a traceback.
            raise SystemExit(f"vnpu-operator: webhook certificate: {exc}") from None
        self._not_after = material.not_after
        self._registered = material.ca_bundle
        app = create_app(
            self.offered,
            runtime_class_name=self.settings.runtime_class_name,
            quotas=self.quotas,
            metrics=self.metrics,
            routing=Routing(
                extended_resources=self.settings.dra and self.settings.dra_extended_resources,
                dra_node_selector=self.settings.dra_node_selector,
            ),
        )
        app.on_response_prepare.append(self._last_on_connection_when_draining)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.webhook_host, self.settings.webhook_port,
            ssl_context=self._context,
        )  # fmt: skip
        await site.start()
        log.info("admission webhooks on https://%s:%d, certificate valid until %s",
                 self.settings.webhook_host, self.settings.webhook_port,
                 _when(material.not_after))  # fmt: skip
        self._task = asyncio.create_task(self._watch(), name="webhook-certificate")

    async def register(self, api_client: client.ApiClient) -> None:
        """Creates or updates both webhook configurations, if a target is set."""
        self._api_client = api_client
        if webhook_target(self.settings) is None:
            return
        await self._register(self._registered)

    async def _register(self, ca_bundle: bytes | None) -> None:
        target = webhook_target(self.settings)
        if target is None or self._api_client is None:
            return
        api = client.AdmissionregistrationV1Api(self._api_client)
        mutating = await self._put(
            mutating_webhook_configuration(target, ca_bundle),
            api.create_mutating_webhook_configuration,
            api.read_mutating_webhook_configuration,
            api.patch_mutating_webhook_configuration,
        )
        validating = await self._put(
            validating_webhook_configuration(target, ca_bundle),
            api.create_validating_webhook_configuration,
            api.read_validating_webhook_configuration,
            api.patch_validating_webhook_configuration,
        )
        if mutating and validating:
            log.info("registered the webhook configurations %s", names.WEBHOOK_CONFIG_NAME)

    async def _still_trusted(self) -> None:
        """Re-registers this replica's CA if the configurations no longer carry it
        (another replica's registration dropped it over MAX_CAS, or an admin edited
        them): without it the API server refuses this replica's certificate."""
        if self._api_client is None or self._registered is None:
            return
        if not isinstance(self._source, SelfSigned) or webhook_target(self.settings) is None:
            return
        api = client.AdmissionregistrationV1Api(self._api_client)
        for read in (
            api.read_mutating_webhook_configuration,
            api.read_validating_webhook_configuration,
        ):
            try:
                existing = self._api_client.sanitize_for_serialization(
                    await read(names.WEBHOOK_CONFIG_NAME)
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                existing = {}
            for webhook in existing.get("webhooks") or [{}]:
                theirs = (webhook.get("clientConfig") or {}).get("caBundle")
                if not theirs or not covers(base64.b64decode(theirs), self._registered):
                    log.info("the webhook configurations lack this replica's CA: registering")
                    await self._register(self._registered)
                    return

    async def _put(
        self,
        body: dict[str, Any],
        create: Callable[..., Awaitable[Any]],
        read: Callable[..., Awaitable[Any]],
        patch: Callable[..., Awaitable[Any]],
    ) -> bool:
        """Merge-patch the whole body over the existing object, or create it where
        there is none. Read first: the chart ships both configurations, so the
        operator needs only get and patch, by name (a create cannot be limited to a
        name); a create is for an operator run without the chart. A body without a
        caBundle takes the existing one, guarded by its resourceVersion so that a
        caBundle injected meanwhile is not lost either. False: it is missing and may not
        be created (logged)."""
        api_client = self._api_client
        if api_client is None:
            return False
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                existing = api_client.sanitize_for_serialization(
                    await read(names.WEBHOOK_CONFIG_NAME)
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                try:
                    await create(body)
                    return True
                except ApiException as exc:
                    if exc.status == 403:
                        # The chart's operator may not create them (RBAC cannot limit a
                        # create by name): someone deleted the chart's copy. Serving goes
                        # on; vNPU pods wait for the configuration, not for a restart loop.
                        log.error(
                            "%s %s does not exist and this operator may not create it; "
                            "`helm upgrade` puts the chart's back (docs/TROUBLESHOOTING.md)",
                            body["kind"], names.WEBHOOK_CONFIG_NAME,
                        )  # fmt: skip
                        return False
                    if exc.status != 409:
                        raise
                    continue  # created in between: read it again
            # Ours joins the CAs registered (other replicas' own); a body without one
            # keeps the one injected.
            update = keep_ca_bundles(merge_ca_bundles(body, existing, _merge_cas), existing)
            version = existing["metadata"]["resourceVersion"]
            update["metadata"] = {**body["metadata"], "resourceVersion": version}
            try:
                await patch(names.WEBHOOK_CONFIG_NAME, update, _content_type=MERGE)
                return True
            except ApiException as exc:
                # 409: changed since read; 404: deleted since read.
                if exc.status not in (404, 409):
                    raise
        raise RuntimeError(
            f"{body['kind']} {names.WEBHOOK_CONFIG_NAME} changed under each of "
            f"{CONFLICT_ATTEMPTS} registrations"
        )

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.webhook_cert_poll_seconds)
            try:
                await self._refresh()
                await self._still_trusted()
            except CertError as exc:
                log.warning(
                    "webhook certificate not reloaded (%s); still serving the one valid "
                    "until %s", exc, _when(self._not_after or 0),
                )  # fmt: skip
            except Exception as exc:
                # Nothing may end the renewal: the next poll tries again.
                log_retry(
                    log, "webhook certificate refresh", exc, self.settings.webhook_cert_poll_seconds
                )

    async def _refresh(self) -> None:
        if self._source is None:
            return
        if self._pending is None:
            self._pending = self._source.refresh()
        new = self._pending
        if new is None:
            return
        registers = self._api_client is not None and webhook_target(self.settings) is not None
        if registers and new.ca_bundle and not covers(self._registered, new.ca_bundle):
            # API servers must trust the new CA before its certificate is served, and the
            # old one while the old certificate still is.
            bundle = handover(new.ca_bundle, self._registered, time.time())
            await self._register(bundle)
            self._registered = bundle
            await asyncio.sleep(HANDOVER_SECONDS)
        self._pending = None
        load(self._context, new, Path(self._tmp.name))
        self._not_after = new.not_after
        log.info("serving a new webhook certificate, valid until %s", _when(new.not_after))

    async def _last_on_connection_when_draining(
        self, _: web.Request, response: web.StreamResponse
    ) -> None:
        if self._draining:
            # "Connection: close": the API server does not send this connection another
            # request, so none is lost to the close. aiohttp has written the header's
            # value by now; force_close makes it close the connection after the answer.
            response.headers[hdrs.CONNECTION] = "close"
            response.force_close()

    async def drain(self, seconds: float) -> None:
        """Answers `seconds` more, each answer with "Connection: close", before stop.

        The API server keeps connections to a webhook alive and reuses them for the
        next admission; a request it writes on one while the server closes it fails
        ("failed calling webhook: EOF"), and for a pod create it does not retry. Through
        the drain every connection the API server uses is closed after its answer, its
        next request opens a new one (to a Ready replica: /readyz answers 503 now), and
        stop closes only connections left idle through the whole drain."""
        if self._runner is None or seconds <= 0:
            return
        self._draining = True
        log.info("stopping: the webhook answers %.1f s more, closing each connection after "
                 "its answer", seconds)  # fmt: skip
        await asyncio.sleep(seconds)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        self._tmp.cleanup()
