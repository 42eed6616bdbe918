"""What both commands share: settings from flags over `VNPU_*` environment
variables, logging, and the HTTP port with /metrics, /healthz and /readyz."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def parse_settings(
    model: type[S],
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    list_fields: Sequence[str] = (),
) -> S:
    """One flag per setting (`--foo-bar` for `foo_bar`); flags win over the
    environment. Bad values exit with pydantic's message naming the setting.
    `list_fields` take comma-separated flag values."""
    parser = argparse.ArgumentParser(prog=prog, description=description, argument_default=None)
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, default=None, help=field.description)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    for name in list_fields:
        if isinstance(overrides.get(name), str):
            overrides[name] = [n.strip() for n in overrides[name].split(",") if n.strip()]
    try:
        return model(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        parser.error(problems)


def configure_logging(level: str) -> None:
    """Plain text on stderr; Kopf logs every handler call at INFO and the
    client every response body at DEBUG, which at hundreds of pods a second
    drowns what matters."""
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("kopf").setLevel(logging.WARNING)
    logging.getLogger("kubernetes_asyncio").setLevel(logging.INFO)


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
