"""Polling until something holds: the integration tests and the benchmark."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 30, interval: float = 0.2
) -> Any:
    """Calls `check` until it returns something truthy and returns that.
    Raises AssertionError naming `what` and the last value when `timeout`
    seconds pass first."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
