"""`vnpu-operator`: admission webhooks, placement and the allocation
lifecycle, one active replica (Kopf standalone: no peering writes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

import kopf
from aiohttp import web
from kubernetes_asyncio import client, config
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vnpu_operator import __version__, names
from vnpu_operator.config import OperatorSettings, parse_args
from vnpu_operator.controller import Controller
from vnpu_operator.handlers import register
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.webhook_server import WebhookServer

log = logging.getLogger("vnpu_operator")


async def serve_http(settings: OperatorSettings, metrics: OperatorMetrics,
                     controller: Controller) -> web.AppRunner:  # fmt: skip
    async def metrics_page(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if controller.synced:
            return web.Response(text="ok")
        return web.Response(status=503, text="caches not synced")

    app = web.Application()
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.metrics_host, settings.metrics_port).start()
    return runner


async def run(settings: OperatorSettings) -> None:
    if settings.kubeconfig:
        # Kopf's login reads the same file through kubernetes-asyncio.
        os.environ["KUBECONFIG"] = str(settings.kubeconfig)
        await config.load_kube_config(config_file=str(settings.kubeconfig))
    else:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    api_client = client.ApiClient()
    api_client.user_agent = f"{names.USER_AGENT_OPERATOR}/{__version__}"
    metrics = OperatorMetrics()
    controller = Controller(OperatorApi(api_client), settings, metrics)
    runner = await serve_http(settings, metrics, controller)
    webhook = WebhookServer(settings, controller.offered_templates)
    await webhook.start()
    await webhook.register(api_client)

    registry = kopf.OperatorRegistry()
    register(registry, controller, settings)
    try:
        await kopf.operator(registry=registry, clusterwide=True, standalone=True)
    finally:
        await webhook.stop()
        await runner.cleanup()
        await api_client.close()


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # Kopf logs every handler call at INFO and the client every response
    # body at DEBUG; at hundreds of pods a second that drowns what matters.
    logging.getLogger("kopf").setLevel(logging.WARNING)
    logging.getLogger("kubernetes_asyncio").setLevel(logging.INFO)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
