"""Pause logging (vnpu_common/process/pauses.py): off unless asked for; a long
collection and a late loop are logged with their start and length."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from vnpu_common.process import eventloop, pauses


def test_off_unless_the_environment_sets_a_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pauses.ENV, raising=False)
    assert pauses.threshold_ms() == 0
    for value, want in (("", 0.0), ("x", 0.0), ("-3", 0.0), ("7.5", 7.5)):
        monkeypatch.setenv(pauses.ENV, value)
        assert pauses.threshold_ms() == want


def test_long_collections_are_kept_until_drained(caplog: pytest.LogCaptureFixture) -> None:
    timer = pauses.GcTimer(threshold=5.0)
    timer("start", {"generation": 2})
    time.sleep(0.01)
    timer("stop", {"generation": 2, "collected": 4})
    timer("start", {"generation": 0})
    timer("stop", {"generation": 0, "collected": 0})  # short: not kept
    assert len(timer.found) == 1
    with caplog.at_level(logging.INFO, logger=pauses.__name__):
        timer.drain()
    assert not timer.found
    [line] = caplog.messages
    assert line.startswith("pause kind=gc start=")
    assert "gen=2 collected=4" in line


def test_a_blocked_loop_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(pauses.ENV, "20")

    async def main() -> int:
        await asyncio.sleep(0.1)
        time.sleep(0.15)  # noqa: ASYNC251 - the loop blocked on purpose
        await asyncio.sleep(0.1)
        return 3

    with caplog.at_level(logging.INFO, logger=pauses.__name__):
        assert eventloop.run(main()) == 3
    loops = [m for m in caplog.messages if m.startswith("pause kind=loop")]
    assert loops, caplog.messages
    ms = float(loops[0].split(" ms=")[1].split()[0])
    assert ms >= 20
