"""The one keyed work queue of the project, as Kubernetes controllers use it.

Event handlers only `add` keys; a handler coroutine does the work. The queue
guarantees what reconcile code relies on:
- one key is handled by at most one task at a time, so the steps of one
  object never interleave;
- adding a key that is already waiting does nothing, and adding one that is
  being handled runs it once more after the current run (nothing seen while
  busy is lost, however many events arrived);
- a handler that raises is retried after `Backoff.delay` of its consecutive
  failures, and a success forgets them;
- `workers` bounds how many keys are handled at once (None: no bound).

The operator runs one queue over pod UIDs (no bound: pods wait on the API,
not on CPU); the agent runs one per node over allocation keys, also without
a bound, and serialises the decisions and driver calls itself
(vnpu_agent/serving.py), so that API writes overlap.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.faults import log_retry

log = logging.getLogger(__name__)

Handler = Callable[[str], Awaitable[None]]


class RetryLater(Exception):  # noqa: N818 - it is a request, not an error
    """Raised by a handler that did what it could for now and wants the key
    again after the backoff (a driver that failed transiently, a vNPU still
    open in a container). Logged as information, without a traceback."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class WorkQueue:
    def __init__(
        self,
        handler: Handler,
        *,
        name: str,
        backoff: Backoff,
        workers: int | None = None,
        describe: Callable[[BaseException], str] = _describe,
        expected: tuple[type[BaseException], ...] = (),
    ) -> None:
        """`expected` exceptions are logged as one WARNING line, as the
        faults `faults.is_expected` names are (API errors are news, not
        bugs); anything else at ERROR with its traceback."""
        if workers is not None and workers < 1:
            raise ValueError("workers must be at least 1")
        self._handler = handler
        self.name = name
        self.backoff = backoff
        self._workers = workers
        self._describe = describe
        self._expected: tuple[type[BaseException], ...] = (RetryLater, *expected)
        self._pending: deque[str] = deque()
        self._queued: set[str] = set()
        self._active: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def add(self, key: str) -> None:
        """Handle `key` soon. Without a running event loop the key waits
        until the next `add` made inside one."""
        if key in self._active:
            self._dirty.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            self._pending.append(key)
        self._pump()

    def add_after(self, key: str, delay: float) -> None:
        """Handle `key` after `delay` seconds; an earlier pending retry of
        the same key wins over a later one."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        due = loop.time() + delay
        old = self._timers.get(key)
        if old is not None:
            if old.when() <= due:
                return
            old.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def forget(self, key: str) -> None:
        """Drops the key's failure count and pending retry (its object is
        gone, or it was handled successfully)."""
        self._failures.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def failures(self, key: str) -> int:
        """Consecutive failed runs of `key` since its last success."""
        return self._failures.get(key, 0)

    def busy(self, key: str) -> bool:
        return key in self._active or key in self._queued

    def __len__(self) -> int:
        return len(self._queued) + len(self._active)

    async def idle(self) -> None:
        """Returns once nothing is queued or running (retries still pending
        on a timer do not count)."""
        while self._active or self._pending:
            if self._active:
                await asyncio.gather(*self._active.values(), return_exceptions=True)
            await asyncio.sleep(0)

    def close(self) -> None:
        """Cancels pending retries and running handlers."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._active.values():
            task.cancel()
        self._pending.clear()
        self._queued.clear()

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _pump(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        while self._pending and (self._workers is None or len(self._active) < self._workers):
            key = self._pending.popleft()
            self._queued.discard(key)
            self._active[key] = loop.create_task(self._run(key), name=f"{self.name}:{key}")

    async def _run(self, key: str) -> None:
        try:
            self._dirty.discard(key)
            try:
                await self._handler(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(key, exc)
            else:
                self.forget(key)
        finally:
            self._active.pop(key, None)
            if key in self._dirty:
                self._dirty.discard(key)
                self._queued.add(key)
                self._pending.append(key)
            self._pump()

    def _failed(self, key: str, exc: Exception) -> None:
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        delay = self.backoff.delay(n)
        if isinstance(exc, RetryLater):
            log.info("%s %s: %s; retry %d in %.1fs", self.name, key, exc, n, delay)
        else:
            log_retry(
                log,
                f"{self.name} {key}",
                exc,
                delay,
                attempt=n,
                expected=self._expected,
                describe=self._describe,
            )
        self.add_after(key, delay)
