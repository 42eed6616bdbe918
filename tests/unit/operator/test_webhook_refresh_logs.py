"""The webhook certificate's renewal, cut off from the API server: each
failed poll is one WARNING line saying when it is tried again, no traceback;
a bug in it keeps its traceback at ERROR. Both keep the renewal going."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.admission.server import WebhookServer
from vnpu_operator.config import parse_args


async def test_a_reset_is_a_warning_line_and_a_bug_an_error_with_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = parse_args(["--webhook-cert-poll-seconds=0.1"])
    server = WebhookServer(settings, lambda: None, QuotaBook())
    faults: list[Exception] = [
        aiohttp.ClientOSError(104, "Connection reset by peer"),
        ValueError("no CA"),
    ]
    polls = 0

    async def refresh() -> None:
        nonlocal polls
        polls += 1
        if faults:
            raise faults.pop(0)

    server._refresh = refresh  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="vnpu_operator.admission.server"):
        server._task = asyncio.create_task(server._watch())
        for _ in range(100):
            if polls >= 3:  # both faults logged, and the renewal still polls
                break
            await asyncio.sleep(0.05)
        await server.stop()
    assert polls >= 3
    reset, bug = caplog.records
    assert (reset.levelno, reset.getMessage(), reset.exc_info) == (
        logging.WARNING,
        "webhook certificate refresh failed (ClientOSError: [Errno 104] Connection reset by "
        "peer); retrying in 0.1 s",
        None,
    )
    assert (bug.levelno, bug.getMessage()) == (
        logging.ERROR,
        "webhook certificate refresh failed (ValueError: no CA); retrying in 0.1 s",
    )
    assert bug.exc_info is not None
    assert isinstance(bug.exc_info[1], ValueError)
