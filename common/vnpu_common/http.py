"""The HTTP port of both commands: /metrics, /healthz and /readyz."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


async def serve_http(
    host: str,
    port: int,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    not_ready: str,
) -> web.AppRunner:
    """/metrics (Prometheus text), /healthz (the process answers) and
    /readyz (503 with `not_ready` until `ready()`)."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text=not_ready)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    # Probes and scrapes answer at once; a shutdown never waits a minute
    # (aiohttp's default) for one stuck client.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
