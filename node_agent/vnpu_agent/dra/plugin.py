"""The kubelet plugin's gRPC side: the Registration service on the kubelet's
plugin registry socket and the DRAPlugin service on the plugin's own socket
(docs/DRA.md, "The kubelet plugin"). Thin adapters: what a call does is
prepare.py's.

The DRA server (DRAPlugin, and DRAResourceHealth: health.py) starts before
the registration socket appears (the kubelet connects to the DRA socket as
soon as it sees the registration); stale
sockets are removed first (ours, and those of earlier agents that nobody
listens on any more), and both sockets carry the pod's UID when the agent
knows it, so that during a rolling update the old and the new agent's
sockets never collide (kubelet >= 1.33).

The registration server runs in threads of its own (grpc's synchronous
server), not on the agent's event loop: the kubelet probes a plugin by
calling GetInfo and unregisters one that does not answer, and the loop is
shared with everything else the agent does (a status built for many nodes,
a checkpoint's fsync, any callback that overruns). Its answer is fixed at
start, so it needs nothing from the loop; the kubelet's registration
notice is handed to the loop (call_soon_threadsafe).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from vnpu_agent.config import AgentSettings
from vnpu_agent.dra import health
from vnpu_agent.dra.prepare import ClaimId, ClaimReader, Preparer
from vnpu_agent.dra.protos.dra.v1 import api_pb2 as dra_pb2
from vnpu_agent.dra.protos.pluginregistration.v1 import api_pb2 as reg_pb2
from vnpu_common.wire import names

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# What the registration advertises: the DRA service, and the health service
# in both versions the kubelet speaks (1.37: v1 first, then v1alpha1; 1.36:
# v1alpha1 only), as Go's helper does (kubeletplugin/draplugin.go).
SUPPORTED_VERSIONS = ("v1.DRAPlugin", *health.VERSIONS)
REGISTRATION_SERVICE = reg_pb2.DESCRIPTOR.services_by_name["Registration"].full_name
DRA_SERVICE = dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name


@dataclass(frozen=True, slots=True)
class Sockets:
    dra: Path  # <plugins dir>/<driver>/dra[-<pod uid>].sock
    registration: Path  # <registry dir>/<driver>[-<pod uid>]-reg.sock


def sockets(driver: str, plugins_dir: Path, registry_dir: Path, pod_uid: str = "") -> Sockets:
    """The names Go's helper gives them (k8s.io/dynamic-resource-allocation
    kubeletplugin, RollingUpdate): with the pod's UID both carry it, so the
    old and the new agent of a rolling update each have their own."""
    part = f"-{pod_uid}" if pod_uid else ""
    return Sockets(
        dra=plugins_dir / driver / f"dra{part}.sock",
        registration=registry_dir / f"{driver}{part}-reg.sock",
    )


class RegistrationService:
    """Served by grpc's synchronous server (`serve_registration`): its
    methods run in its threads, never on the event loop."""

    def __init__(
        self,
        driver: str,
        endpoint: Path,
        registered: Callable[[], None] = lambda: None,
        *,
        versions: Sequence[str] = SUPPORTED_VERSIONS,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """`registered()` each time the kubelet accepts the plugin, on `loop`
        (the agent's): the kubelet deletes a driver's ResourceSlices while
        its plugin is not registered, so the pool must be read back then."""
        self.driver = driver
        self.endpoint = endpoint
        self.registered = registered
        self.loop = loop
        self.info = reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver,
            endpoint=str(endpoint),
            supported_versions=list(versions),
        )

    def get_info(self, _request: reg_pb2.InfoRequest, _context: Any) -> reg_pb2.PluginInfo:
        return self.info

    def notify_registration_status(
        self, request: reg_pb2.RegistrationStatus, _context: Any
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("the kubelet registered DRA plugin %s", self.driver)
            if self.loop is None:
                self.registered()
            else:
                with contextlib.suppress(RuntimeError):  # the loop closed: shutting down
                    self.loop.call_soon_threadsafe(self.registered)
        else:
            log.error("the kubelet refused DRA plugin %s: %s", self.driver, request.error)
        return reg_pb2.RegistrationStatusResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            REGISTRATION_SERVICE,
            {
                "GetInfo": grpc.unary_unary_rpc_method_handler(
                    self.get_info,
                    request_deserializer=reg_pb2.InfoRequest.FromString,
                    response_serializer=reg_pb2.PluginInfo.SerializeToString,
                ),
                "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                    self.notify_registration_status,
                    request_deserializer=reg_pb2.RegistrationStatus.FromString,
                    response_serializer=reg_pb2.RegistrationStatusResponse.SerializeToString,
                ),
            },
        )


def _claims(request: dra_pb2.NodePrepareResourcesRequest) -> list[ClaimId]:
    return [ClaimId(c.namespace, c.uid, c.name) for c in request.claims]


class DRAService:
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def prepare(
        self,
        request: dra_pb2.NodePrepareResourcesRequest,
        _context: aio.ServicerContext[object, object],
    ) -> dra_pb2.NodePrepareResourcesResponse:
        results = await self.preparer.prepare(_claims(request))
        response = dra_pb2.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for d in result.devices:
                entry.devices.append(
                    dra_pb2.Device(
                        request_names=[d.request],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_ids),
                    )
                )
        return response

    async def unprepare(
        self,
        request: dra_pb2.NodeUnprepareResourcesRequest,
        _context: aio.ServicerContext[object, object],
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        claims = [ClaimId(c.namespace, c.uid, c.name) for c in request.claims]
        results = await self.preparer.unprepare(claims)
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            response.claims[uid].error = error
        return response

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            DRA_SERVICE,
            {
                "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                    self.prepare,
                    request_deserializer=dra_pb2.NodePrepareResourcesRequest.FromString,
                    response_serializer=dra_pb2.NodePrepareResourcesResponse.SerializeToString,
                ),
                "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                    self.unprepare,
                    request_deserializer=dra_pb2.NodeUnprepareResourcesRequest.FromString,
                    response_serializer=dra_pb2.NodeUnprepareResourcesResponse.SerializeToString,
                ),
            },
        )


def _remove_stale(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        log.info("removed stale socket %s", path)


def _listened(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(path))
        except OSError:
            return False
        return True


def remove_dead_sockets(paths: Sockets, driver: str) -> None:
    """Sockets an earlier agent of this driver left behind (a crash, a
    rolling update's old pod killed): removed when nothing listens on them,
    so the kubelet does not keep trying them. A live one (the other agent of
    a rolling update) is left alone."""
    candidates = [
        *paths.dra.parent.glob("dra*.sock"),
        *paths.registration.parent.glob(f"{driver}-*reg.sock"),
    ]
    for path in candidates:
        if path not in (paths.dra, paths.registration) and not _listened(path):
            _remove_stale(path)


async def _serve(handlers: Sequence[grpc.GenericRpcHandler], path: Path) -> aio.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    server = aio.server()
    server.add_generic_rpc_handlers(tuple(handlers))
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise OSError(f"cannot listen on {path}")
    await server.start()
    return server


def serve_registration(service: RegistrationService, path: Path) -> grpc.Server:
    """The registration service on its socket, in threads of its own (two:
    GetInfo and the registration notice are the kubelet's only calls)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="dra-reg"))
    server.add_generic_rpc_handlers((service.handler(),))
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise OSError(f"cannot listen on {path}")
    server.start()
    return server


class KubeletPlugin:
    """Both servers of the plugin; `start` then `stop`."""

    def __init__(
        self,
        driver: str,
        preparer: Preparer,
        paths: Sockets,
        registered: Callable[[], None] = lambda: None,
        *,
        chip_health: Callable[[], Mapping[int, bool] | None] | None = None,
    ) -> None:
        """`chip_health()`: the node's chips' health (index -> healthy; None
        when the driver does not answer), for the health service; without
        it the service is neither served nor advertised."""
        self.driver = driver
        self.preparer = preparer
        self.paths = paths
        self.registered = registered
        self.health = (
            None
            if chip_health is None
            else health.HealthService(
                lambda: health.prepared_devices(preparer.checkpoint), chip_health
            )
        )
        self._dra: aio.Server | None = None
        self._registration: grpc.Server | None = None

    async def start(self) -> None:
        self.paths.dra.parent.mkdir(parents=True, exist_ok=True)
        self.paths.registration.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_sockets(self.paths, self.driver)
        handlers = [DRAService(self.preparer).handler()]
        versions: list[str] = [SUPPORTED_VERSIONS[0]]
        if self.health is not None:
            handlers += self.health.handlers()
            versions += list(health.VERSIONS)
        self._dra = await _serve(handlers, self.paths.dra)
        reg = RegistrationService(
            self.driver,
            self.paths.dra,
            self.registered,
            versions=versions,
            loop=asyncio.get_running_loop(),
        )
        self._registration = serve_registration(reg, self.paths.registration)
        log.info(
            "DRA kubelet plugin %s serving %s (%s), registered through %s",
            self.driver,
            self.paths.dra,
            ", ".join(versions),
            self.paths.registration,
        )

    async def stop(self, grace: float = 2.0) -> None:
        # Registration first: the kubelet stops sending calls to a plugin
        # whose registration socket is gone.
        if self._registration is not None:
            stopped = self._registration.stop(grace)
            await asyncio.to_thread(stopped.wait, grace + 1.0)
            self._registration = None
        if self._dra is not None:
            await self._dra.stop(grace)
            self._dra = None
        _remove_stale(self.paths.registration)
        _remove_stale(self.paths.dra)


def for_node(
    settings: AgentSettings,
    node: str,
    reader: ClaimReader,
    registered: Callable[[], None] = lambda: None,
    chip_health: Callable[[], Mapping[int, bool] | None] | None = None,
) -> tuple[Preparer, KubeletPlugin]:
    """The plugin of the node this agent serves, from its settings: the
    checkpoint in the node's state directory, the specs in the CDI directory."""
    preparer = Preparer(
        node,
        reader,
        settings.state_dir / node / "dra" / "checkpoint.json",
        settings.cdi_dir,
        settings.cdi_host_device_dir,
        # The metadata files are mounted into containers by their host path, so
        # they live in the plugin's own directory, at the same path inside the
        # agent's container and on the host (as its socket does), not in the
        # state directory, which the chart mounts elsewhere (agent.hostPaths.state).
        metadata_dir=settings.dra_plugins_dir / names.DRA_DRIVER / names.DRA_METADATA_HOST_SUBDIR,
    )
    paths = sockets(
        names.DRA_DRIVER, settings.dra_plugins_dir, settings.dra_registry_dir, settings.pod_uid
    )
    plugin = KubeletPlugin(names.DRA_DRIVER, preparer, paths, registered, chip_health=chip_health)
    return preparer, plugin
