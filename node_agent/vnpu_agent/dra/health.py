"""The kubelet plugin's DRAResourceHealth service (KEP-4680; issue 54, item
10): each prepared device's health, from its chip's, streamed to the kubelet,
which shows it in the pod's `status.containerStatuses[].allocatedResourcesStatus`.

`NodeWatchResources` is a server stream the kubelet opens once the plugin is
registered with the service advertised (plugin.SUPPORTED_VERSIONS: `v1` and
`v1alpha1`, the two the 1.37 kubelet speaks; 1.36 speaks only `v1alpha1`).
Each report is the complete list of the node's prepared devices (the
kubelet reconciles its cache with it), each Healthy, Unhealthy or Unknown
(its chip is not listed, or the driver does not answer), and names a device
by pool and device name, as the claim's allocation does.

When: at once when the stream opens, within a poll interval of any change
(a chip's health as the driver view last read it, a claim prepared or
unprepared), and again every RESEND_SECONDS whatever happens: the kubelet
shows a device Unknown when it heard nothing of it for its
health_check_timeout_seconds, which each report sets to 30 s (the kubelet's
default), so a report is re-sent three times within it.

Read-only: the prepared devices are what the preparer's checkpoint holds,
the chips' health what the driver view last read; nothing here calls the
driver or the API server, so a stream never waits on either.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

import grpc
from grpc import aio

from vnpu_agent.dra.checkpoint import COMPLETED, Checkpoint
from vnpu_agent.dra.protos.drahealth.v1 import api_pb2 as health_v1
from vnpu_agent.dra.protos.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from vnpu_common.wire import names

log = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT_SECONDS: Final = 30
RESEND_SECONDS: Final = 10.0
POLL_SECONDS: Final = 1.0

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"

# Service name -> its generated messages; the names are what the registration
# advertises (`v1.DRAResourceHealth`: the protos' packages are `v1`, `v1alpha1`).
VERSIONS: Final[dict[str, ModuleType]] = {
    health_v1.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name: health_v1,
    health_v1alpha1.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name: health_v1alpha1,
}


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    health: str  # HEALTHY, UNHEALTHY or UNKNOWN
    message: str = ""


@dataclass(frozen=True, slots=True)
class PreparedOne:
    """A device of a prepared claim, as the report names it."""

    pool: str
    device: str
    chip: int  # -1: not known


def prepared_devices(checkpoint: Checkpoint) -> list[PreparedOne]:
    """The devices of the claims prepared in this boot (PrepareCompleted): one
    still being prepared is not the kubelet's yet, and an earlier boot's
    entry names nothing the kubelet runs now."""
    out = []
    for entry in checkpoint.entries.values():
        if entry.phase != COMPLETED or entry.boot_id != checkpoint.boot_id:
            continue
        for d in entry.devices:
            chip = d.chip
            if chip < 0:
                parsed = names.parse_dra_device_name(d.device)
                chip = parsed[0] if parsed is not None else -1
            out.append(PreparedOne(d.pool, d.device, chip))
    return out


def report(prepared: Iterable[PreparedOne], chips: Mapping[int, bool] | None) -> list[DeviceHealth]:
    """Each prepared device's health, from its chip's (`chips`: index ->
    healthy; None when the driver does not answer), sorted, each device once."""
    out: dict[tuple[str, str], DeviceHealth] = {}
    for d in prepared:
        if chips is None:
            health, why = UNKNOWN, "the NPU driver does not answer"
        elif d.chip not in chips:
            health, why = UNKNOWN, f"chip {d.chip} is not listed by the driver"
        elif chips[d.chip]:
            health, why = HEALTHY, ""
        else:
            health, why = UNHEALTHY, f"chip {d.chip} reports unhealthy"
        out[(d.pool, d.device)] = DeviceHealth(d.pool, d.device, health, why)
    return [out[k] for k in sorted(out)]


def _message(module: ModuleType, devices: list[DeviceHealth], now: float) -> Any:
    status = {
        HEALTHY: module.HealthStatus.HEALTHY,
        UNHEALTHY: module.HealthStatus.UNHEALTHY,
        UNKNOWN: module.HealthStatus.UNKNOWN,
    }
    return module.NodeWatchResourcesResponse(
        devices=[
            module.DeviceHealth(
                device=module.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                health=status[d.health],
                last_updated_time=int(now),
                health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_SECONDS,
                message=d.message,
            )
            for d in devices
        ]
    )


class HealthService:
    """NodeWatchResources for both versions, from two plain readers:
    `prepared()` the prepared devices, `chips()` the chips' health (None:
    unknown). `poke()` sends a changed report before the next poll."""

    def __init__(
        self,
        prepared: Callable[[], Iterable[PreparedOne]],
        chips: Callable[[], Mapping[int, bool] | None],
        *,
        poll_seconds: float = POLL_SECONDS,
        resend_seconds: float = RESEND_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.prepared = prepared
        self.chips = chips
        self.poll_seconds = poll_seconds
        self.resend_seconds = resend_seconds
        self.clock = clock
        self._changed: set[asyncio.Event] = set()
        self.streams = 0  # open now

    def poke(self) -> None:
        for event in self._changed:
            event.set()

    def current(self) -> list[DeviceHealth]:
        try:
            return report(self.prepared(), self.chips())
        except Exception:  # never end the kubelet's stream on a reading error
            log.exception("device health not read; reported Unknown")
            return [
                DeviceHealth(d.pool, d.device, UNKNOWN, "the agent could not read it")
                for d in self._last_prepared()
            ]

    def _last_prepared(self) -> list[PreparedOne]:
        try:
            return list(self.prepared())
        except Exception:
            return []

    async def _watch(
        self, module: ModuleType, _request: Any, _context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        self._changed.add(changed)
        self.streams += 1
        sent: list[DeviceHealth] | None = None
        sent_at = -1e9
        try:
            while True:
                devices = self.current()
                now = loop.time()
                if devices != sent or now - sent_at >= self.resend_seconds:
                    if devices != sent:
                        log.info(
                            "device health to the kubelet: %s",
                            ", ".join(f"{d.device} {d.health}" for d in devices) or "no device",
                        )
                    yield _message(module, devices, self.clock())
                    sent, sent_at = devices, now
                wait = min(self.poll_seconds, max(sent_at + self.resend_seconds - now, 0.0))
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=wait)
        finally:
            self._changed.discard(changed)
            self.streams -= 1

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """One generic handler per version of the service."""
        # A partial of the async generator method: grpc serves a handler as a
        # stream of its own only when it sees an async generator function.
        return [
            grpc.method_handlers_generic_handler(
                service,
                {
                    "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                        functools.partial(self._watch, module),
                        request_deserializer=module.NodeWatchResourcesRequest.FromString,
                        response_serializer=module.NodeWatchResourcesResponse.SerializeToString,
                    )
                },
            )
            for service, module in VERSIONS.items()
        ]
