"""Both components' logs: text lines by default, one JSON object per line
with --log-format=json, Kopf's loggers through the same handler."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime

import pytest

from vnpu_common.process.logs import configure_logging


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """What configure_logging writes; the root logger restored afterwards
    (pytest's own capture handlers included)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("kopf", "kubernetes_asyncio")}
    yield io.StringIO()
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_json_lines_carry_time_level_logger_message_and_exception(
    stream: io.StringIO,
) -> None:
    configure_logging("INFO", "json", stream=stream)
    logging.getLogger("vnpu_operator.placing").info("placed %s on %s", "team-a/p", "npu-1")
    try:
        raise RuntimeError("driver said no")
    except RuntimeError:
        logging.getLogger("vnpu_agent").exception("create failed")
    logging.getLogger("vnpu_agent").debug("below the level")

    placed, failed = (json.loads(line) for line in _lines(stream))
    assert {k: placed[k] for k in ("level", "logger", "message")} == {
        "level": "INFO",
        "logger": "vnpu_operator.placing",
        "message": "placed team-a/p on npu-1",
    }
    assert "exception" not in placed
    assert datetime.fromisoformat(placed["time"]).utcoffset() is not None
    assert (failed["level"], failed["message"]) == ("ERROR", "create failed")
    assert failed["exception"].startswith("Traceback (most recent call last):")
    assert failed["exception"].endswith("RuntimeError: driver said no")


def test_kopf_logs_go_through_the_same_handler(stream: io.StringIO) -> None:
    import kopf  # noqa: F401 - its loggers, and the Event poster it adds to one

    configure_logging("DEBUG", "json", stream=stream)
    objects = logging.getLogger("kopf.objects")
    objects.warning("handler failed", extra={"k8s_ref": {"kind": "Pod", "name": "p"}})
    objects.info("handler succeeded")  # Kopf's chatter stays below WARNING
    (line,) = _lines(stream)
    record = json.loads(line)
    assert (record["logger"], record["message"]) == ("kopf.objects", "handler failed")
    assert record["k8s_ref"] == {"kind": "Pod", "name": "p"}


def test_text_is_the_default(stream: io.StringIO) -> None:
    configure_logging("INFO", stream=stream)
    logging.getLogger("vnpu_agent").warning("lease renewal failed")
    (line,) = _lines(stream)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING vnpu_agent lease renewal failed", line
    ), line


def test_configuring_again_replaces_the_handler(stream: io.StringIO) -> None:
    configure_logging("INFO", "text", stream=io.StringIO())
    configure_logging("INFO", "json", stream=stream)
    logging.getLogger("x").info("once")
    assert [json.loads(line)["message"] for line in _lines(stream)] == ["once"]


def test_kopfs_retried_requests_are_warnings_and_its_last_try_an_error(
    stream: io.StringIO,
) -> None:
    configure_logging("INFO", "json", stream=stream)
    api = logging.getLogger("kopf._cogs.clients.api")
    what = "GET https://127.0.0.1:6443/api/v1/resourcequotas -> ClientConnectorError()"
    api.error(f"Request attempt #2/10 failed; will retry: {what}")
    api.error(f"Request attempt #10/10 failed; escalating: {what}")
    logging.getLogger("vnpu_operator").error("Request attempt #1 failed; will retry: not Kopf's")
    assert [json.loads(line)["level"] for line in _lines(stream)] == ["WARNING", "ERROR", "ERROR"]
