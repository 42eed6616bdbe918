"""The DRAResourceHealth service (vnpu_agent/dra/health.py; issue 54, item
10) over a real unix socket, read as the kubelet reads it in both versions
(v1, v1alpha1): every prepared device of this boot with its chip's health,
at once when the stream opens, again promptly when a chip's health changes,
and re-sent within the kubelet's 30 s timeout when nothing changes."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from vnpu_agent.dra import health
from vnpu_agent.dra.checkpoint import COMPLETED, STARTED, Checkpoint, ClaimId, Entry, PreparedDevice
from vnpu_agent.dra.plugin import KubeletPlugin, sockets
from vnpu_agent.dra.prepare import Preparer
from vnpu_agent.dra.protos.drahealth.v1 import api_pb2 as v1
from vnpu_agent.dra.protos.drahealth.v1 import api_pb2_grpc as v1_grpc
from vnpu_agent.dra.protos.drahealth.v1alpha1 import api_pb2 as v1alpha1
from vnpu_agent.dra.protos.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from vnpu_common.wire import names

BOOT = "boot-1"


def device(name: str, chip: int = -1, vnpu_id: int = 100) -> PreparedDevice:
    return PreparedDevice(
        request="npu", pool="n1", device=name, vnpu_id=vnpu_id, template="vir05_1c_16g",
        cdi_ids=(f"vnpu.io/claim=u-{name}",), chip=chip,
    )  # fmt: skip


def entry(uid: str, *devices: PreparedDevice, phase: Any = COMPLETED, boot: str = BOOT) -> Entry:
    return Entry(ClaimId("ns", uid, f"c-{uid}"), phase, boot, list(devices))


def test_only_the_devices_of_claims_prepared_in_this_boot_are_reported(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id=BOOT)
    cp.entries = {
        "a": entry("a", device("npu-0-vir05-1c-16g-0", chip=0), device("npu-1-vir05-1c-16g-0")),
        "b": entry("b", device("npu-2-vir05-1c-16g-0", chip=2), phase=STARTED),
        "c": entry("c", device("npu-3-vir05-1c-16g-0", chip=3), boot="boot-0"),
    }
    assert health.prepared_devices(cp) == [
        health.PreparedOne("n1", "npu-0-vir05-1c-16g-0", 0),
        # No chip recorded (a version 1 entry): read from the device's name.
        health.PreparedOne("n1", "npu-1-vir05-1c-16g-0", 1),
    ]


def test_each_device_has_its_chips_health() -> None:
    prepared = [
        health.PreparedOne("n1", "npu-1-vir05-1c-16g-0", 1),
        health.PreparedOne("n1", "npu-0-vir05-1c-16g-0", 0),
        health.PreparedOne("n1", "npu-7-vir05-1c-16g-0", 7),
    ]
    got = health.report(prepared, {0: True, 1: False})
    assert [(d.device, d.health, d.message) for d in got] == [
        ("npu-0-vir05-1c-16g-0", "Healthy", ""),
        ("npu-1-vir05-1c-16g-0", "Unhealthy", "chip 1 reports unhealthy"),
        ("npu-7-vir05-1c-16g-0", "Unknown", "chip 7 is not listed by the driver"),
    ]
    down = health.report(prepared, None)
    assert {d.health for d in down} == {"Unknown"}
    assert down[0].message == "the NPU driver does not answer"


class Fixture:
    def __init__(self, preparer: Preparer, path: Path) -> None:
        self.preparer = preparer
        self.path = path
        self.chips: dict[int, bool] | None = {0: True, 1: True}


@pytest.fixture
def sock_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="drahl", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def served(sock_root: Path, tmp_path: Path) -> AsyncIterator[Fixture]:
    paths = sockets(names.DRA_DRIVER, sock_root / "plugins", sock_root / "registry", "pod-1")

    class NoReads:
        async def resource_claim(self, namespace: str, name: str) -> Any:
            return None

        async def allocation(self, namespace: str, name: str) -> Any:
            return None

    preparer = Preparer("n1", NoReads(), tmp_path / "checkpoint.json", tmp_path / "cdi")
    fx = Fixture(preparer, paths.dra)
    plugin = KubeletPlugin(names.DRA_DRIVER, preparer, paths, chip_health=lambda: fx.chips)
    assert plugin.health is not None
    plugin.health.poll_seconds = 0.05
    plugin.health.resend_seconds = 0.5
    cp = preparer.checkpoint
    cp.entries = {"a": entry("a", device("npu-0-vir05-1c-16g-0", chip=0), boot=cp.boot_id)}
    await plugin.start()
    try:
        yield fx
    finally:
        await plugin.stop(grace=0)


def states(response: Any) -> list[tuple[str, str, int]]:
    return [
        (d.device.device_name, v1.HealthStatus.Name(d.health), d.health_check_timeout_seconds)
        for d in response.devices
    ]


@pytest.mark.parametrize(("pb", "stub"), [(v1, v1_grpc), (v1alpha1, v1alpha1_grpc)])
async def test_the_stream_reports_at_once_on_change_and_again_before_the_timeout(
    served: Fixture, pb: Any, stub: Any
) -> None:
    """Fails before issue 54: the plugin served no health service."""
    channel = grpc.aio.insecure_channel(f"unix://{served.path}")
    try:
        stream = stub.DRAResourceHealthStub(channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest()
        )
        loop = asyncio.get_running_loop()

        async def next_report(within: float) -> tuple[Any, float]:
            start = loop.time()
            got = await asyncio.wait_for(stream.read(), timeout=within)
            return got, loop.time() - start

        first, _ = await next_report(2.0)
        assert states(first) == [("npu-0-vir05-1c-16g-0", "HEALTHY", 30)]
        assert first.devices[0].device.pool_name == "n1"
        assert first.devices[0].last_updated_time > 0

        # Nothing changes: the same report again within the resend period.
        again, waited = await next_report(2.0)
        assert states(again) == states(first)
        assert 0.3 < waited < 1.0

        # The chip goes bad: reported within a poll, not at the next resend.
        served.chips = {0: False, 1: True}
        sick, waited = await next_report(2.0)
        assert states(sick) == [("npu-0-vir05-1c-16g-0", "UNHEALTHY", 30)]
        assert sick.devices[0].message == "chip 0 reports unhealthy"
        assert waited < 0.3

        # A second claim prepared on chip 1, and the driver stops answering.
        cp = served.preparer.checkpoint
        cp.entries["b"] = entry("b", device("npu-1-vir05-1c-16g-0", chip=1), boot=cp.boot_id)
        served.chips = None
        down, _ = await next_report(2.0)
        assert states(down) == [
            ("npu-0-vir05-1c-16g-0", "UNKNOWN", 30),
            ("npu-1-vir05-1c-16g-0", "UNKNOWN", 30),
        ]
        stream.cancel()
    finally:
        await channel.close()


async def test_a_reading_error_reports_unknown_and_keeps_the_stream() -> None:
    calls = 0

    def chips() -> dict[int, bool]:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    service = health.HealthService(lambda: [health.PreparedOne("n1", "d", 0)], chips)
    assert [(d.device, d.health) for d in service.current()] == [("d", "Unknown")]
    assert calls == 1
