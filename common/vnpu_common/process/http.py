"""The HTTP port of both commands: /metrics, /healthz and /readyz."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from vnpu_common.process.metrics_auth import TokenCheck, api_review, self_signed_context
from vnpu_common.process.settings import ComponentSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guarded(handler: Handler, auth: TokenCheck) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        verdict = await auth.check(request.headers.get("Authorization"))
        if not verdict.allowed:
            headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else None
            return web.Response(status=verdict.status, text=verdict.reason, headers=headers)
        return await handler(request)

    return guarded


async def serve_http(
    host: str,
    port: int,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    not_ready: str | Callable[[], str],
    *,
    probe_port: int = 0,
    tls: ssl.SSLContext | None = None,
    auth: TokenCheck | None = None,
) -> web.AppRunner:
    """/metrics, /healthz (the process answers) and /readyz (503 with
    `not_ready` until `ready()`). /metrics is the client library's own
    handler: the OpenMetrics format to a scraper that asks for it (Prometheus
    does), the text format otherwise, gzip when the request accepts it, and
    `name[]` to ask for some metrics only.

    With `auth`, /metrics answers only a bearer token the API server lets get
    /metrics (metrics_auth.py), over `tls`. With `probe_port`, /healthz and
    /readyz are also served in plain HTTP on every address at that port: the
    kubelet probes the pod's IP, which a /metrics port on localhost (for a
    proxy sidecar) or behind a token does not answer the way a probe wants."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        return web.Response(
            status=503, text=not_ready if isinstance(not_ready, str) else not_ready()
        )

    def with_probes(app: web.Application) -> web.Application:
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        return app

    # Probes and scrapes answer at once; a shutdown never waits a minute
    # (aiohttp's default) for one stuck client.
    def runner_of(app: web.Application) -> web.AppRunner:
        return web.AppRunner(app, access_log=None, shutdown_timeout=2.0)

    metrics: Handler = make_aiohttp_handler(registry)
    app = with_probes(web.Application())
    app.router.add_get("/metrics", metrics if auth is None else _guarded(metrics, auth))
    sites = [(runner_of(app), host, port, tls)]
    if probe_port:
        probes = runner_of(with_probes(web.Application()))
        # One runner for the caller to clean up: the probes' goes with it.
        app.on_cleanup.append(lambda _: probes.cleanup())
        sites.append((probes, "0.0.0.0", probe_port, None))
    for runner, site_host, site_port, site_tls in sites:
        await runner.setup()
        await web.TCPSite(runner, site_host, site_port, ssl_context=site_tls).start()
    return sites[0][0]


async def serve_component(
    component: str,
    settings: ComponentSettings,
    api_client: client.ApiClient,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    not_ready: str | Callable[[], str],
) -> web.AppRunner:
    """serve_http as a component's settings say: its address and port, the probe
    port, and with metrics_auth=kubernetes a token check over TLS."""
    secured = settings.metrics_auth == "kubernetes"
    return await serve_http(
        settings.metrics_host,
        settings.metrics_port,
        registry,
        ready,
        not_ready,
        probe_port=settings.probe_port,
        tls=self_signed_context(component) if secured else None,
        auth=TokenCheck(api_review(api_client)) if secured else None,
    )
