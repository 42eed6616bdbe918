"""`vnpu-operator`: admission webhooks, placement and the allocation
lifecycle. Every replica keeps the caches and answers the webhook; the one
that holds the leader Lease (leader.py) reconciles and writes. Kopf runs
standalone (docs/ARCHITECTURE.md, 'What Kopf does here')."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

import kopf

from vnpu_common.process import eventloop, gcfreeze, memory
from vnpu_common.process.http import serve_component
from vnpu_common.process.logs import configure_logging
from vnpu_common.process.startup import check_port, load_kube_config
from vnpu_operator.config import OperatorSettings, parse_args
from vnpu_operator.wiring import build

log = logging.getLogger("vnpu_operator")
PROG = "vnpu-operator"


async def run(settings: OperatorSettings) -> None:
    """Runs the parts `wiring.build` made: the metrics and probes server, the
    webhook, then Kopf (its handlers start the informers, the Lease watch,
    the convergence and the leader election) until it stops."""
    # A port in use or no cluster: one line and exit 1 (vnpu_common.process.startup).
    check_port(PROG, settings.metrics_host, settings.metrics_port, "--metrics-port")
    check_port(PROG, settings.webhook_host, settings.webhook_port, "--webhook-port")
    await load_kube_config(PROG, settings.kubeconfig)
    if settings.kubeconfig:
        # Kopf's login reads the same file through kubernetes-asyncio.
        os.environ["KUBECONFIG"] = str(settings.kubeconfig)
    parts = await build(settings)
    webhook, metrics = parts.webhook, parts.metrics
    runner = await serve_component(
        PROG, settings, parts.api_client, metrics.registry, parts.ready, parts.not_ready
    )
    metrics.watch_certificate(webhook.cert_not_after)
    await webhook.start()
    await webhook.register(parts.api_client)
    trimming = asyncio.create_task(memory.trimmer().run(), name="memory-trim")
    # The caches synced are most of the heap, and live as long as the process.
    freezing = asyncio.create_task(
        gcfreeze.Freezer(parts.controller.synced_event).run(), name="gc-freeze"
    )
    try:
        await kopf.operator(registry=parts.registry, clusterwide=True, standalone=True)
    finally:
        trimming.cancel()
        freezing.cancel()
        await webhook.stop()
        await runner.cleanup()
        await parts.api_client.close()


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    configure_logging(settings.log_level, settings.log_format)
    for deprecation in settings.deprecations():
        log.warning("%s", deprecation)
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(run(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
