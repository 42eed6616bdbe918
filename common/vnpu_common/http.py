"""The HTTP port of both commands: /metrics, /healthz and /readyz."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler


async def serve_http(
    host: str,
    port: int,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    not_ready: str | Callable[[], str],
) -> web.AppRunner:
    """/metrics, /healthz (the process answers) and /readyz (503 with
    `not_ready` until `ready()`). /metrics is the client library's own
    handler: the OpenMetrics format to a scraper that asks for it (Prometheus
    does), the text format otherwise, gzip when the request accepts it, and
    `name[]` to ask for some metrics only."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        return web.Response(
            status=503, text=not_ready if isinstance(not_ready, str) else not_ready()
        )

    app = web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    # Probes and scrapes answer at once; a shutdown never waits a minute
    # (aiohttp's default) for one stuck client.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
