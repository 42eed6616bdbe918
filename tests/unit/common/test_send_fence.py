"""A fenced write asks its fence again at the last moment: a write that
passed the fence, then waited for a connection while the fence closed, is
not sent (the frozen leader of tests/integration/test_leader_election.py,
whose create went out after SIGCONT because it had been waiting for a
connection when the process stopped)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from vnpu_common.kube.apiclient import api_client
from vnpu_common.kube.apiwrites import FencedWrite, Writes, error_counter


class Server:
    """Answers every request with `{}`; the first one only once `release`
    is set, holding the client's only connection until then."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(f"{request.method} {request.path}")
        self.arrived.set()
        if len(self.seen) == 1:
            await self.release.wait()
        return web.json_response({})


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", s.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    s.url = f"http://127.0.0.1:{port}"
    yield s
    s.release.set()
    await runner.cleanup()


class Gate:
    def __init__(self) -> None:
        self.open = True
        self.refused: list[str] = []

        self.asked: list[str] = []

    def __call__(self, operation: str) -> None:
        self.asked.append(operation)
        if not self.open:
            self.refused.append(operation)
            raise FencedWrite(status=0, reason=f"{operation} not sent")


async def _second_write_after_the_fence_closes(
    server: Server, *, fenced: bool, body: bool = False
) -> Exception | None:
    """Two writes through one connection: the second (a create with a body,
    or a delete without) passes the fence,
    waits for the connection, the fence closes, the first returns. What the
    second raised (None: it was sent)."""
    api = api_client(
        "vnpu-test/fence", connections=1,
        configuration=client.Configuration(host=server.url), fenced=fenced,
    )  # fmt: skip
    registry = CollectorRegistry()
    gate = Gate()
    writes = Writes(error_counter("vnpu_test", "Failed writes.", registry), gate)
    core = client.CoreV1Api(api)
    try:
        first = asyncio.create_task(
            writes.call("delete_first", core.delete_namespaced_config_map, "a", "ns")
        )
        await server.arrived.wait()
        second = asyncio.create_task(
            writes.call(
                "create_second", core.create_namespaced_config_map, "ns",
                {"metadata": {"name": "b"}},
            )
            if body
            else writes.call("delete_second", core.delete_namespaced_config_map, "b", "ns")
        )  # fmt: skip
        await asyncio.sleep(0.1)  # past the first ask, waiting for the connection
        assert not second.done()
        gate.open = False
        server.release.set()
        assert await first == 200
        try:
            await second
        except FencedWrite as exc:
            assert gate.refused == [f"{'create' if body else 'delete'}_second"]
            assert registry.get_sample_value(
                "vnpu_test_api_errors_total", {"operation": gate.refused[0], "status": "0"}
            ) is None  # fmt: skip
            return exc
        return None
    finally:
        await api.close()


@pytest.mark.parametrize("body", [False, True], ids=["delete", "create"])
async def test_a_write_whose_fence_closed_while_it_waited_is_not_sent(
    server: Server, body: bool
) -> None:
    refused = await _second_write_after_the_fence_closes(server, fenced=True, body=body)
    assert isinstance(refused, FencedWrite)
    assert server.seen == ["DELETE /api/v1/namespaces/ns/configmaps/a"]


async def test_without_the_trace_the_same_write_goes_out(server: Server) -> None:
    # What the trace prevents: the fence asked only when the write started.
    assert await _second_write_after_the_fence_closes(server, fenced=False) is None
    assert server.seen[-1] == "DELETE /api/v1/namespaces/ns/configmaps/b"


async def test_requests_outside_a_fenced_write_pass(server: Server) -> None:
    # The standby's own upkeep (webhook certificates) uses the same client unfenced.
    server.release.set()
    api = api_client(
        "vnpu-test/fence", configuration=client.Configuration(host=server.url), fenced=True
    )
    try:
        await client.CoreV1Api(api).delete_namespaced_config_map("c", "ns")
    finally:
        await api.close()
    assert server.seen == ["DELETE /api/v1/namespaces/ns/configmaps/c"]


async def test_the_fence_is_asked_right_before_headers_and_before_the_body(
    server: Server,
) -> None:
    # On Python 3.11 aiohttp writes a body (with the buffered headers) one
    # event-loop turn after the headers hook: the last ask is the body's.
    server.release.set()
    gate = Gate()
    api = api_client(
        "vnpu-test/fence", configuration=client.Configuration(host=server.url), fenced=True
    )
    writes = Writes(error_counter("vnpu_test", "", CollectorRegistry()), gate)
    core = client.CoreV1Api(api)
    try:
        await writes.call("delete", core.delete_namespaced_config_map, "c", "ns")
        await writes.call("create", core.create_namespaced_config_map, "ns", {"metadata": {}})
    finally:
        await api.close()
    assert gate.asked == ["delete"] * 2 + ["create"] * 3


async def test_a_lease_renewal_held_up_past_its_deadline_is_not_sent(server: Server) -> None:
    """The leader's renewals do not wait for each other's answers; one that
    waited for a connection (or was frozen before it went out) until the
    renew deadline passed is not sent: the replica reads the Lease first."""
    from vnpu_operator.election import Record, Timing
    from vnpu_operator.leader import Leadership

    now = [100.0]
    api = api_client(
        "vnpu-test/fence", connections=1,
        configuration=client.Configuration(host=server.url), fenced=True,
    )  # fmt: skip
    lead = Leadership(
        client.CoordinationV1Api(api), "ns", "me",
        timing=Timing(4, 3.0, 0.5), clock=lambda: now[0],
    )  # fmt: skip
    lead.election.written(
        Record(holder="me", lease_seconds=4, transitions=0, acquired="", version="1"), 100.0
    )
    try:
        settled: list[str] = []

        def heard() -> None:
            settled.append("settled")

        # The first renewal takes the only connection and is held there.
        first = asyncio.create_task(lead._renew(client.CoordinationV1Api(api), heard))
        await server.arrived.wait()
        second = asyncio.create_task(lead._renew(client.CoordinationV1Api(api), heard))
        await asyncio.sleep(0.05)
        now[0] = 103.5  # past the deadline of the renewal sent at 100
        server.release.set()
        await asyncio.gather(first, second)
    finally:
        await api.close()
    lease = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/vnpu-operator-leader"
    assert server.seen == [f"PATCH {lease}"]
    assert settled == ["settled", "settled"]
