"""`vnpu-agent`: serves one node (DaemonSet) or many simulated nodes (demo,
benchmarks) from one process, with one shared allocation watch and one
shared watch of its VNPUNodes."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_agent import modes
from vnpu_agent.config import AgentSettings, parse_args
from vnpu_agent.dra import plugin as dra_plugin
from vnpu_agent.dra import served
from vnpu_agent.dra.plugin import KubeletPlugin
from vnpu_agent.dra.prepare import ApiClaimReader
from vnpu_agent.dra.publisher import (
    PoolPublisher,
    ResourceApiMissingError,
    SliceApi,
    SliceWatcher,
    delete_pools,
)
from vnpu_agent.drivers import backends, make_driver
from vnpu_agent.drivers.base import Driver
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.leases import LeaseRenewer
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.node import NodeAgent
from vnpu_agent.watcher import ListWatcher
from vnpu_common import __version__
from vnpu_common.kube.apiclient import api_client as new_api_client
from vnpu_common.kube.rawcall import call_json
from vnpu_common.process import eventloop, gcfreeze, memory
from vnpu_common.process.http import serve_component
from vnpu_common.process.logs import configure_logging
from vnpu_common.process.startup import check_port, load_kube_config
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw

# Named, not __name__: run as `python -m vnpu_agent.main` (the local plane) that
# would be "__main__".
log = logging.getLogger("vnpu_agent.main")

# Within the kubelet's default 30 s grace period: each step of the shutdown
# (tasks, HTTP server) gets a few seconds, the whole of it a hard limit.
SHUTDOWN_STEP_SECONDS = 5.0
SHUTDOWN_SECONDS = 15.0


async def _sim_layout(core: client.CoreV1Api, node: str, fallback: str) -> str:
    """The node's simulated chips: its annotation, else the configured layout."""
    try:
        # Raw: a Node turned into client models is most of a start's CPU at
        # 250 nodes per process, for one annotation.
        obj = await call_json(core.read_node, node)
        layout = ((obj.get("metadata") or {}).get("annotations") or {}).get(names.ANN_SIM_CHIPS)
        if layout:
            return str(layout)
    except ApiException as exc:
        if exc.status != 404:
            raise
    if not fallback:
        raise SystemExit(
            f"vnpu-agent: node {node} has no {names.ANN_SIM_CHIPS} annotation and no "
            "--sim-chips was given; cannot simulate its chips"
        )
    return fallback


async def build_driver(settings: AgentSettings, core: client.CoreV1Api, node: str) -> Driver:
    """The node's driver, as its row in drivers/backends.py builds it from the settings."""
    row = backends.backend(settings.driver)
    layout = None
    if row.layout_setting is not None:
        layout = await _sim_layout(core, node, getattr(settings, row.layout_setting))
    given = backends.AgentInputs(
        {name: getattr(settings, name) for name in row.settings}, settings.state_dir / node, layout
    )
    return make_driver(settings.driver, **row.agent_options(given))


class Agent:
    """All node agents of this process, their watch, Leases and HTTP port."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.metrics = AgentMetrics()
        self.nodes: dict[str, NodeAgent] = {}
        self.watcher: ListWatcher | None = None  # the allocations
        self.node_watcher: ListWatcher | None = None  # the VNPUNodes
        self.api_client: client.ApiClient | None = None

    async def _dispatch(self, kind: str, obj: Raw) -> None:
        node = obj.get("metadata", {}).get("labels", {}).get(names.LABEL_NODE)
        agent = self.nodes.get(node or "")
        if agent is not None:
            await agent.on_event(kind, obj)

    async def _dispatch_node(self, kind: str, obj: Raw) -> None:
        # By name, not label: a VNPUNode relabelled to another node of this
        # process is still the one of the node it is named after.
        agent = self.nodes.get(obj.get("metadata", {}).get("name", ""))
        if agent is not None:
            await agent.on_node_event(kind, obj)

    def _leases(self, api: AgentApi) -> LeaseRenewer:
        duration = self.settings.lease_duration_seconds

        async def renew(node: str) -> None:
            await api.renew_lease(node, duration)

        # Three renewals per duration: two may fail before the node expires.
        return LeaseRenewer(lambda: list(self.nodes), renew, duration / 3)

    def ready(self) -> bool:
        return (
            self.watcher is not None
            and self.watcher.synced.is_set()
            and all(a.driver_ok for a in self.nodes.values())
        )

    async def serve_http(self) -> web.AppRunner:
        s = self.settings
        if self.api_client is None:
            raise RuntimeError("the HTTP port is served after run() made the API client")
        return await serve_component(
            "vnpu-agent",
            s,
            self.api_client,
            self.metrics.registry,
            self.ready,
            "allocation view not synced or driver down",
        )

    async def run(self) -> None:
        s = self.settings
        # A port in use or no cluster: one line and exit 1 (vnpu_common.process.startup).
        check_port("vnpu-agent", s.metrics_host, s.metrics_port, "--metrics-port")
        await load_kube_config("vnpu-agent", s.kubeconfig)
        self.api_client = new_api_client(f"{names.USER_AGENT_AGENT}/{__version__}")
        api = AgentApi(self.api_client, s.agent_namespace, self.metrics.api_errors)
        core = client.CoreV1Api(self.api_client)
        slice_api = None
        if s.dra:
            slice_api = SliceApi(self.api_client, self.metrics.api_errors)
            try:
                await slice_api.check_served()
            except ResourceApiMissingError as exc:
                raise SystemExit(f"vnpu-agent: {exc}") from None
        self.watcher = ListWatcher(
            client.CustomObjectsApi(self.api_client),
            names.ALLOCATION_PLURAL,
            s.nodes,
            self._dispatch,
            timeout_seconds=s.watch_timeout_seconds,
            retry_max_seconds=s.retry_max_seconds,
        )
        watcher = self.watcher
        self.node_watcher = ListWatcher(
            client.CustomObjectsApi(self.api_client),
            names.NODE_PLURAL,
            s.nodes,
            self._dispatch_node,
            timeout_seconds=s.watch_timeout_seconds,
            retry_max_seconds=s.retry_max_seconds,
        )
        for i, node in enumerate(s.nodes):
            driver = await build_driver(s, core, node)
            self.nodes[node] = NodeAgent(
                node, driver, api, s, self.metrics, synced=watcher.synced.is_set,
                slice_api=slice_api, resync_phase=i / len(s.nodes),
            )  # fmt: skip
        self.metrics.watch(lambda: list(self.nodes.values()), pod_names=s.metrics_pod_names)
        pools = {n: a.pool for n, a in self.nodes.items() if a.pool is not None}
        plugin = await self._kubelet_plugin()
        runner = await self.serve_http()
        log.info(
            "serving %d node(s) with the %s driver%s",
            len(self.nodes),
            s.driver,
            ", as DRA pools" if s.dra else "",
        )
        tasks = [
            asyncio.create_task(watcher.run(), name="watch"),
            asyncio.create_task(self.node_watcher.run(), name="watch-vnpunodes"),
            asyncio.create_task(self._leases(api).run(), name="leases"),
            asyncio.create_task(memory.trimmer().run(), name="memory-trim"),
            # Its nodes' state, loaded by then, lives as long as the process.
            asyncio.create_task(gcfreeze.Freezer(watcher.synced).run(), name="gc-freeze"),
        ]
        try:
            # The nodes are served only once their allocations say this mode
            # is theirs (modes.py): a refused switch changes nothing.
            await self._check_modes(watcher, tasks)
            tasks += [asyncio.create_task(a.run(), name=f"node-{n}") for n, a in self.nodes.items()]
            # After the mode check: a refused switch keeps the pool its claims need.
            tasks += self._dra_tasks(slice_api, pools)
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            _, stuck = await asyncio.wait(tasks, timeout=SHUTDOWN_STEP_SECONDS)
            for t in stuck:
                log.error("shutdown: task %s did not stop when cancelled", t.get_name())
            await runner.cleanup()
            if plugin is not None:
                await plugin.stop()
            await self.api_client.close()

    async def _check_modes(self, watcher: ListWatcher, tasks: list[asyncio.Task[Any]]) -> None:
        """Waits for the allocation view, then raises ModeConflictError if a
        node holds live allocations of the front-end this agent does not serve."""
        synced = asyncio.create_task(watcher.synced.wait(), name="synced")
        try:
            done, _ = await asyncio.wait([synced, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            synced.cancel()
        if synced not in done:
            return  # a task ended first: gather reports it
        problems = [
            why
            for node, agent in self.nodes.items()
            if (why := modes.conflict(node, self.settings.dra, agent.allocs.values())) is not None
        ]
        if problems:
            raise modes.ModeConflictError("; ".join(problems))

    def _dra_tasks(
        self, slice_api: SliceApi | None, pools: dict[str, PoolPublisher]
    ) -> list[asyncio.Task[None]]:
        """With --dra, the watch that puts the pools back within seconds
        (dra/publisher.SliceWatcher); without, the node leaves DRA: its pool,
        if it has one, is deleted once."""
        assert self.api_client is not None
        s = self.settings
        if slice_api is not None:
            # Before the node tasks publish (they have not run yet).
            served.mark(s.state_dir, s.nodes)
            watcher = SliceWatcher(
                slice_api, pools,
                timeout_seconds=s.watch_timeout_seconds, retry_max_seconds=s.retry_max_seconds,
            )  # fmt: skip
            return [asyncio.create_task(watcher.run(), name="watch-resourceslices")]
        api = SliceApi(self.api_client, self.metrics.api_errors)

        # Only the nodes that served DRA last time may have a pool (dra/served.py).
        left = served.marked(s.state_dir, s.nodes)
        if not left:
            return []

        async def leave() -> None:
            try:
                await delete_pools(api, left, written=self.metrics.dra_pool_write)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("the DRA pools of %s not deleted: %s", ", ".join(left), exc)
            else:
                served.unmark(s.state_dir, left)

        return [asyncio.create_task(leave(), name="leave-dra")]

    async def _kubelet_plugin(self) -> KubeletPlugin | None:
        """With --dra and --node-name: the node's kubelet plugin, serving
        before the node's allocations are; with --simulate-nodes none (their
        kubelets, kwok's, call no plugin; docs/DRA.md, "The kubelet plugin")."""
        s = self.settings
        if not s.dra or s.simulate_nodes:
            return None
        assert self.api_client is not None
        agent = self.nodes[s.node_name]
        pool = agent.pool
        preparer, plugin = dra_plugin.for_node(
            s,
            s.node_name,
            ApiClaimReader(self.api_client),
            registered=pool.recheck if pool is not None else lambda: None,
            # The health service's chips: as the driver view last read them.
            chip_health=lambda: (
                {c.index: c.healthy for c in agent.view.chips} if agent.view.ok else None
            ),
        )
        # The plugin's last line of defense asks the node's allocations and
        # vNPUs before each Prepare (dra/prepare.DeviceGuard).
        preparer.guard = agent.serving
        preparer.observe = self.metrics.dra_call
        self.metrics.dra_serving()
        # The chip model of a device, for its KEP-5304 metadata file.
        preparer.chip_model = lambda chip: next(
            (c.model for c in agent.view.chips if c.index == chip), None
        )
        agent.serving.use_prepared_claims(preparer)
        await plugin.start()
        return plugin


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["check"]:
        # `vnpu-agent check`: the hardware self-check (check.py), no cluster needed.
        from vnpu_agent import check

        return check.main(args[1:])
    settings = parse_args(args)
    configure_logging(settings.log_level, settings.log_format)
    for deprecation in settings.deprecations():
        log.warning("%s", deprecation)
    agent = Agent(settings)

    async def runner() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def stop(sig: signal.Signals) -> None:
            log.info("%s: shutting down", sig.name)
            # A shutdown that hangs (a driver call stuck in its thread keeps
            # asyncio.run from returning) must not outlive the pod's grace
            # period silently: dump every thread's stack and exit.
            faulthandler.dump_traceback_later(SHUTDOWN_SECONDS, exit=True)
            task.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig)
        with contextlib.suppress(asyncio.CancelledError):
            await agent.run()

    try:
        eventloop.run(runner())
    except modes.ModeConflictError as exc:
        log.error("refusing to serve: %s", exc)
        return 2
    faulthandler.cancel_dump_traceback_later()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
