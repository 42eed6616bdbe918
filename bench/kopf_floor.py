"""Kopf's own floor: a Kopf operator watching every kind the operator
watches, pods and allocations included, with the operator's Kopf settings
(`configure`), filters and handler layout (an index and an event handler per
kind) and empty handlers.

Run next to the real operator it receives the same event stream, so its CPU
per event is what Kopf itself costs for that stream. The operator watches
pods and allocations with informers (vnpu_operator/watches.py) because this
floor was above half of its CPU; the figure shows what that saves. It
writes nothing (event and index handlers only, no diff-base), needs the
operator's read access, and touches a file once its first event handler
has run (the caches' "synced" moment in the
operator).

    python -m bench.kopf_floor --kubeconfig K --ready-file F
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import kopf

from vnpu_common.process import eventloop
from vnpu_common.process.logs import configure_logging
from vnpu_common.wire import names
from vnpu_operator.config import OperatorSettings
from vnpu_operator.handlers import configure
from vnpu_operator.watches import managed_pod


def build(ours: OperatorSettings, ready_file: Path | None) -> kopf.OperatorRegistry:
    """The registry: handlers.register's layout with nothing in the handlers."""
    registry = kopf.OperatorRegistry()
    synced = False

    def mark_synced() -> None:
        nonlocal synced
        if not synced:
            synced = True
            if ready_file is not None:
                ready_file.touch()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, ours)

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return await kopf.login_via_async_client(**kwargs)

    def listing(**_: Any) -> bool:
        return not synced

    def deleted(event: kopf.RawEvent) -> bool:
        mark_synced()
        return event["type"] == "DELETED"

    kinds = (
        (names.GROUP, names.VERSION, names.ALLOCATION_PLURAL),
        (names.GROUP, names.VERSION, names.NODE_PLURAL),
        ("", "v1", "nodes"),
    )
    for group, version, plural in kinds:
        # Index names are global in Kopf: one id per kind, as the operator's function names.
        @kopf.index(group, version, plural, id=f"{plural}_index", when=listing, registry=registry)
        async def index(body: kopf.Body, **_: Any) -> None:
            pass

        @kopf.on.event(group, version, plural, id=f"{plural}_event", registry=registry)
        async def on_event(event: kopf.RawEvent, **_: Any) -> None:
            deleted(event)

    def listing_ours(body: kopf.Body, **_: Any) -> bool:
        return not synced and managed_pod(body)

    def ours_event(event: kopf.RawEvent, **_: Any) -> bool:
        return managed_pod(event["object"])

    @kopf.index("", "v1", "pods", when=listing_ours, registry=registry)
    async def pods_index(body: kopf.Body, **_: Any) -> None:
        pass

    @kopf.on.event("", "v1", "pods", when=ours_event, registry=registry)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        deleted(event)

    return registry


async def run(kubeconfig: Path, ready_file: Path | None) -> None:
    # Kopf's login reads the file through kubernetes-asyncio, as the operator's does.
    os.environ["KUBECONFIG"] = str(kubeconfig)
    ours = OperatorSettings(kubeconfig=kubeconfig)
    await kopf.operator(registry=build(ours, ready_file), clusterwide=True, standalone=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kopf_floor", description=__doc__)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--ready-file", type=Path, default=None)
    args = p.parse_args(argv)
    # The operator's logging in the benchmark (INFO; Kopf's per-handler lines off).
    configure_logging("INFO")
    with contextlib.suppress(KeyboardInterrupt):
        # The operator's event loop, so that the floor differs from it only
        # in what Kopf does.
        eventloop.run(run(args.kubeconfig, args.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
