"""A stopping replica's webhook (WebhookServer.drain): it answers on for the drain,
every answer closing its connection, so the API server never writes an admission
onto a kept-alive connection the server is closing (a pod create it would not retry).
Plain HTTP/1.1 over TLS on real sockets, as the API server talks to it."""

from __future__ import annotations

import asyncio
import ssl

from localplane.plane import free_port
from vnpu_common.wire import names
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.admission.server import WebhookServer
from vnpu_operator.config import parse_args

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def _connect(port: int) -> Conn:
    return await asyncio.open_connection("127.0.0.1", port, ssl=_insecure())


async def _get(conn: Conn) -> tuple[int, dict[str, str], bytes]:
    """One GET of the health path on `conn`: status, headers (lower-case), body."""
    reader, writer = conn
    writer.write(f"GET {names.WEBHOOK_HEALTH_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status_line, *lines = head.decode().strip().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


async def _closed(conn: Conn, within: float) -> bool:
    """Whether the server closes `conn` within `within` s (False: still open)."""
    try:
        data = await asyncio.wait_for(conn[0].read(1), within)
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        return True
    return data == b""


async def test_a_draining_webhook_answers_and_closes_each_connection_after_its_answer() -> None:
    port = free_port()
    settings = parse_args(["--webhook-host=127.0.0.1", f"--webhook-port={port}"])
    server = WebhookServer(settings, lambda: None, QuotaBook())
    await server.start()
    drain: asyncio.Task[None] | None = None
    try:
        used, idle = await _connect(port), await _connect(port)
        for conn in (used, idle):
            status, headers, _ = await _get(conn)
            assert status == 200
            assert headers.get("connection", "keep-alive").lower() == "keep-alive"
        assert not server.draining

        drain = asyncio.create_task(server.drain(1.5))
        await asyncio.sleep(0.05)
        assert server.draining

        # A request on a kept-alive connection is answered, and that answer is its last.
        status, headers, body = await _get(used)
        assert (status, body.strip()) == (200, b"ok")
        assert headers["connection"].lower() == "close"
        assert await _closed(used, 2)

        # A connection opened during the drain (the endpoint not yet gone) is served too.
        late = await _connect(port)
        status, headers, _ = await _get(late)
        assert status == 200
        assert headers["connection"].lower() == "close"
        assert await _closed(late, 2)

        # A connection idle through the drain is not closed under the API server meanwhile.
        assert not await _closed(idle, 0.3)
        await drain
        await server.stop()
        assert await _closed(idle, 2)
        try:
            await _connect(port)
        except OSError:
            pass
        else:
            raise AssertionError("a stopped webhook still accepts connections")
    finally:
        if drain is not None:
            drain.cancel()
        await server.stop()


async def test_no_drain_when_its_seconds_are_zero() -> None:
    port = free_port()
    settings = parse_args([
        "--webhook-host=127.0.0.1", f"--webhook-port={port}", "--webhook-drain-seconds=0",
    ])  # fmt: skip
    server = WebhookServer(settings, lambda: None, QuotaBook())
    await server.start()
    try:
        conn = await _connect(port)
        await asyncio.wait_for(server.drain(settings.webhook_drain_seconds), 1)
        assert not server.draining
        status, headers, _ = await _get(conn)
        assert status == 200
        assert headers.get("connection", "keep-alive").lower() == "keep-alive"
    finally:
        await server.stop()
