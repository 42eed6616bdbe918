"""The kubelet probes a registered plugin by calling Registration.GetInfo and
unregisters one that does not answer (issue 54, item 9): GetInfo answers,
over the real unix socket, while a Prepare holds the preparer's lock, while
a driver call is blocked in its thread, and while the agent's event loop
itself is blocked (the registration server has threads of its own). Also:
what the registration advertises, and its notice reaching the loop."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from vnpu_agent.config import AgentSettings
from vnpu_agent.dra.plugin import KubeletPlugin, Sockets, sockets
from vnpu_agent.dra.prepare import ClaimId, Preparer
from vnpu_agent.dra.protos.pluginregistration.v1 import api_pb2 as reg_pb2
from vnpu_agent.dra.protos.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.driverview import DriverView
from vnpu_agent.metrics import AgentMetrics
from vnpu_common.wire import names

# The generated stubs are untyped (grpcio-tools writes no types for them).
Stub: Any = reg_grpc.RegistrationStub


class NoReads:
    async def resource_claim(self, namespace: str, name: str) -> Any:
        return None

    async def allocation(self, namespace: str, name: str) -> Any:
        return None


@pytest.fixture
def sock_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="drareg", dir="/tmp"))  # unix paths: 107 bytes at most
    yield root
    shutil.rmtree(root, ignore_errors=True)


class Running:
    def __init__(self, plugin: KubeletPlugin, preparer: Preparer, paths: Sockets) -> None:
        self.plugin, self.preparer, self.paths = plugin, preparer, paths
        self.registered = 0


@pytest.fixture
async def running(sock_root: Path, tmp_path: Path) -> AsyncIterator[Running]:
    paths = sockets(names.DRA_DRIVER, sock_root / "plugins", sock_root / "registry", "pod-1")
    preparer = Preparer("n1", NoReads(), tmp_path / "checkpoint.json", tmp_path / "cdi")
    out: Running | None = None

    def registered() -> None:
        assert out is not None
        out.registered += 1

    plugin = KubeletPlugin(
        names.DRA_DRIVER, preparer, paths, registered, chip_health=lambda: {0: True}
    )
    out = Running(plugin, preparer, paths)
    await plugin.start()
    try:
        yield out
    finally:
        await plugin.stop(grace=0)


def get_info_from_a_thread(path: Path, timeout: float = 1.0) -> Any:
    """GetInfo as the kubelet calls it, from a thread of its own with its own
    grpc client: whatever the test's event loop is doing."""
    with grpc.insecure_channel(f"unix://{path}") as channel:
        return Stub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=timeout)


async def get_info(path: Path) -> Any:
    return await asyncio.to_thread(get_info_from_a_thread, path)


async def test_get_info_answers_while_a_prepare_holds_the_lock(running: Running) -> None:
    await running.preparer.lock.acquire()
    try:
        # A Prepare waiting behind the lock, as the kubelet's retry would.
        waiting = asyncio.create_task(running.preparer.prepare([ClaimId("ns", "u1", "c")]))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        info = await get_info(running.paths.registration)
        assert info.name == names.DRA_DRIVER
        assert info.endpoint == str(running.paths.dra)
    finally:
        running.preparer.lock.release()
    await waiting


async def test_get_info_answers_while_a_driver_call_is_blocked(
    running: Running, tmp_path: Path
) -> None:
    release = threading.Event()
    sim = SimDriver(tmp_path / "sim.json", "910B3=1")
    view = DriverView("n1", sim, AgentSettings(simulate_nodes=["n1"]), AgentMetrics())

    def stuck() -> list[Any]:
        release.wait(10)
        return []

    call = asyncio.create_task(view.call("list_chips", stuck))
    await asyncio.sleep(0.05)
    try:
        assert not call.done()
        info = await get_info(running.paths.registration)
        assert info.type == "DRAPlugin"
    finally:
        release.set()
    await call


async def test_get_info_answers_while_the_event_loop_is_blocked(running: Running) -> None:
    """Fails before issue 54: the registration server ran on the agent's
    event loop, so anything that held the loop held the kubelet's probe."""
    answers: list[Any] = []
    errors: list[BaseException] = []

    def probe() -> None:
        try:
            answers.append(get_info_from_a_thread(running.paths.registration, timeout=1.0))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(2.0)  # noqa: ASYNC251 - the point: the loop held, no callback or task runs
    thread.join(timeout=5)
    assert not errors, errors
    assert [a.name for a in answers] == [names.DRA_DRIVER]


async def test_the_registration_advertises_the_health_service_in_both_versions(
    running: Running,
) -> None:
    """Fails before issue 54: only v1.DRAPlugin was advertised."""
    info = await get_info(running.paths.registration)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


async def test_the_kubelets_notice_reaches_the_event_loop(running: Running) -> None:
    def notify() -> None:
        with grpc.insecure_channel(f"unix://{running.paths.registration}") as channel:
            stub = Stub(channel)
            stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=True), timeout=2
            )

    await asyncio.to_thread(notify)
    for _ in range(50):
        if running.registered:
            break
        await asyncio.sleep(0.01)
    assert running.registered == 1


async def test_a_plugin_without_health_advertises_only_the_dra_service(
    sock_root: Path, tmp_path: Path
) -> None:
    paths = sockets(names.DRA_DRIVER, sock_root / "p", sock_root / "r")
    preparer = Preparer("n1", NoReads(), tmp_path / "checkpoint.json", tmp_path / "cdi")
    plugin = KubeletPlugin(names.DRA_DRIVER, preparer, paths)
    await plugin.start()
    try:
        info = await get_info(paths.registration)
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
    finally:
        await plugin.stop(grace=0)
    assert not paths.registration.exists()
    assert not paths.dra.exists()
