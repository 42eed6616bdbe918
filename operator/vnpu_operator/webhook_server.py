"""Serves the admission webhooks over TLS and registers their configurations.

Certificates come from a directory (Helm secret or cert-manager) or are
generated at start: a CA that lives as long as the process and a serving
certificate for the loopback address and the Service's DNS names. With a
generated CA the operator must register the configurations itself, since
only it knows the CA bundle.
"""

from __future__ import annotations

import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common import certs, names
from vnpu_common.patches import MERGE
from vnpu_operator.admission import (
    ServiceRef,
    mutating_webhook_configuration,
    validating_webhook_configuration,
)
from vnpu_operator.admission.configurations import WebhookTarget
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.admission.webhook import OfferedSource, create_app
from vnpu_operator.config import OperatorSettings

log = logging.getLogger(__name__)


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


class WebhookServer:
    def __init__(
        self, settings: OperatorSettings, offered: OfferedSource, quotas: QuotaBook
    ) -> None:
        self.settings = settings
        self.offered = offered
        self.quotas = quotas
        self.ca_pem: bytes | None = None
        self._not_after: float | None = None
        self._runner: web.AppRunner | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="vnpu-webhook-")

    def _tls(self) -> ssl.SSLContext:
        s = self.settings
        if s.webhook_cert_dir is not None:
            cert, key = s.webhook_cert_dir / "tls.crt", s.webhook_cert_dir / "tls.key"
            ca = s.webhook_cert_dir / "ca.crt"
            self.ca_pem = ca.read_bytes() if ca.exists() else None
        else:
            authority = certs.make_ca("vnpu-operator-webhook-ca")
            dns = [*s.webhook_dns_names, "localhost"]
            target = webhook_target(s)
            if isinstance(target, ServiceRef):
                svc = f"{target.name}.{target.namespace}"
                dns += [svc, f"{svc}.svc", f"{svc}.svc.cluster.local"]
            leaf = certs.issue(
                authority, "vnpu-operator-webhook", dns_names=tuple(dns),
                ip_addresses=("127.0.0.1",),
            )  # fmt: skip
            cert, key = Path(self._tmp.name) / "tls.crt", Path(self._tmp.name) / "tls.key"
            leaf.write(cert, key)
            self.ca_pem = authority.cert_pem
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self._not_after = certs.not_after(cert.read_bytes())
        return context

    def cert_not_after(self) -> float | None:
        """Epoch seconds of the served leaf's notAfter; None before the server has one."""
        return self._not_after

    async def start(self) -> None:
        app = create_app(
            self.offered, runtime_class_name=self.settings.runtime_class_name, quotas=self.quotas
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.webhook_host, self.settings.webhook_port,
            ssl_context=self._tls(),
        )  # fmt: skip
        await site.start()
        log.info("admission webhooks on https://%s:%d", self.settings.webhook_host,
                 self.settings.webhook_port)  # fmt: skip

    async def register(self, api_client: client.ApiClient) -> None:
        """Creates or updates both webhook configurations, if a target is set."""
        target = webhook_target(self.settings)
        if target is None:
            return
        api = client.AdmissionregistrationV1Api(api_client)
        pairs: list[tuple[dict[str, Any], Any, Any]] = [
            (
                mutating_webhook_configuration(target, self.ca_pem),
                api.create_mutating_webhook_configuration,
                api.patch_mutating_webhook_configuration,
            ),
            (
                validating_webhook_configuration(target, self.ca_pem),
                api.create_validating_webhook_configuration,
                api.patch_validating_webhook_configuration,
            ),
        ]
        for body, create, patch in pairs:
            try:
                await create(body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                await patch(names.WEBHOOK_CONFIG_NAME, body, _content_type=MERGE)
        log.info("registered the webhook configurations %s", names.WEBHOOK_CONFIG_NAME)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._tmp.cleanup()
