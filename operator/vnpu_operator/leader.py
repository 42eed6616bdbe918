"""The leader election's runner: reads and writes the Lease every
`retry_seconds` by `election.Election`'s rules (a leader's renewals
overlapping, the rest one at a time), and tells the controllers when this
replica starts and stops leading.

Every replica runs the informers and serves the webhook; only the leader
reconciles and writes (docs/HELM.md, 'High availability'). `may_write` is
the fence every write of `OperatorApi` and `ClaimApi` asks when it starts
and again just before its first byte goes out (`apiwrites.send_fence`);
`started` and `stopped` are called on each change, and a timer fires
`stopped` at the renew deadline if no renewal came back by then (a frozen
process sees that timer overdue the moment it resumes, and its clock has
refused every write already).

In the operator the Lease is read and written from a thread of its own, with
its own event loop and API client (`thread_api`): the controller's loop can
be busy for seconds (a 2000-node sync on a loaded machine), and a renewal
queued behind that work would miss the renew deadline of a healthy leader
(measured: 19 needless step-downs in one 2000-node run on 2 cores with the
4 s lease). The thread needs the GIL for a few milliseconds per renewal and
gets it every switch interval. Only the Election's state is shared: the
thread writes it, the main loop reads it (`may_write` compares one float),
and every change is announced on the main loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter, Gauge

from vnpu_common.kube.apiwrites import FencedWrite, fenced
from vnpu_common.kube.rawcall import call_json, describe
from vnpu_common.wire import names
from vnpu_common.wire.patches import JSON_PATCH
from vnpu_operator.election import Election, Record, Timing

log = logging.getLogger(__name__)

# A write refused because the Lease changed or is gone: 409 over a stale
# resourceVersion, 422 from a JSON patch's failed test (the holder changed).
_CHANGED = (404, 409, 422)


Listener = Callable[[], None]


class NotLeading(FencedWrite):
    """A write this replica refused to send: it does not lead, or its last
    renewal is older than the renew deadline. An ApiException (status 0)
    so that every caller treats it as the failed write it is: logged
    without a traceback, retried with backoff, booked capacity given back."""

    def __init__(self, operation: str) -> None:
        super().__init__(status=0, reason=f"not the leader: {operation} not sent")


class Leadership:
    """One replica's part in the election. `started()` and `stopped()` are
    the listeners' hooks; `leading()` and `check()` the fence."""

    def __init__(
        self,
        api: client.CoordinationV1Api | None,
        namespace: str,
        identity: str,
        *,
        timing: Timing | None = None,
        name: str = names.LEADER_LEASE_NAME,
        leader_gauge: Gauge | None = None,
        changes: Counter | None = None,
        refused: Counter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        thread_api: Callable[[], client.ApiClient] | None = None,
    ) -> None:
        """`api` None: no election, this replica always leads (the
        operator's `--no-leader-election`, and unit tests). `thread_api`:
        makes the client the election thread uses (called in that thread);
        None: the election runs on the caller's loop with `api`."""
        self.api = api
        self.thread_api = thread_api
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.namespace = namespace
        self.name = name
        self.election = Election(identity, timing or Timing())
        self.clock = clock
        self.wall = wall
        self.leader_gauge = leader_gauge
        self.changes = changes
        self.refused = refused
        self.listeners: list[tuple[Listener, Listener]] = []
        self.announce: Callable[[str, str], Coroutine[Any, Any, None]] | None = None
        self._leading = api is None
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        if leader_gauge is not None:
            leader_gauge.set(1 if self._leading else 0)

    @property
    def identity(self) -> str:
        return self.election.identity

    def on_change(self, started: Listener, stopped: Listener) -> None:
        self.listeners.append((started, stopped))

    # ------------------------------------------------------------ the fence

    def leading(self) -> bool:
        if self.api is None:
            return True
        return self._leading and self.election.may_write(self.clock())

    def check(self, operation: str) -> None:
        """Raises NotLeading unless this replica may write now."""
        if not self.leading():
            if self.refused is not None:
                self.refused.labels(operation).inc()
            raise NotLeading(operation)

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Tries to take or renew the Lease every `retry_seconds` until
        cancelled."""
        if self.api is None:
            return
        log.info(
            "leader election: Lease %s/%s as %s (lease %ds, renew deadline %gs, retry %gs)",
            self.namespace, self.name, self.identity, self.election.timing.lease_seconds,
            self.election.timing.renew_deadline, self.election.timing.retry_seconds,
        )  # fmt: skip
        if self.thread_api is None:
            await self._tries(self.api, self._settle)
            return
        main = asyncio.get_running_loop()
        exited = asyncio.Event()

        def body() -> None:
            try:
                asyncio.run(self._thread_tries(main))
            finally:
                with contextlib.suppress(RuntimeError):  # the main loop closed first
                    main.call_soon_threadsafe(exited.set)

        self._stop.clear()
        self._thread = threading.Thread(target=body, name="leader-election", daemon=True)
        self._thread.start()
        try:
            await exited.wait()
        finally:
            await self._stop_thread()

    async def _tries(self, api: client.CoordinationV1Api, settled: Callable[[], None]) -> None:
        """Every `retry_seconds`: a leader within its deadline sends a renewal
        without waiting for the ones still unanswered (up to
        `renewals_in_flight`; election.py says why that is safe); anyone else
        waits for those, reads the Lease and writes over the version read."""
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while not self._stop.is_set():
                try:
                    if self._renews():
                        if len(in_flight) < self.election.timing.renewals_in_flight:
                            task = asyncio.create_task(self._renew(api, settled))
                            in_flight.add(task)
                            task.add_done_callback(in_flight.discard)
                    else:
                        if in_flight:
                            await asyncio.wait(in_flight)
                        await self.attempt(api)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(
                        "leader election: Lease %s not written: %s", self.name, describe(exc)
                    )
                settled()
                await asyncio.sleep(self.election.timing.retry_seconds)
        finally:
            # A renewal must not land after the hand-back: each is given
            # up at the renew deadline anyway.
            if in_flight:
                await asyncio.wait(in_flight, timeout=self.election.timing.renew_deadline)
            for task in in_flight:
                task.cancel()

    def _renewal_fence(self, operation: str) -> None:
        if not self.election.may_write(self.clock()):
            raise NotLeading(operation)

    def _renews(self) -> bool:
        return self.election.may_write(self.clock()) and self.election.holder() == self.identity

    async def _renew(self, api: client.CoordinationV1Api, settled: Callable[[], None]) -> None:
        election = self.election
        patch = election.renewal(self.wall())
        sent = self.clock()
        try:
            # Asked again as its bytes go out (a client with `send_fence`):
            # created just before the process froze, it must not go out
            # once it resumes past its deadline; `attempt` reads first then.
            with fenced(self._renewal_fence, "renew Lease"):
                answer = await call_json(
                    api.patch_namespaced_lease, self.name, self.namespace, patch,
                    _content_type=JSON_PATCH, _request_timeout=election.timing.renew_deadline,
                )  # fmt: skip
        except FencedWrite:
            pass
        except ApiException as exc:
            if exc.status in _CHANGED:
                election.conflicted(sent)
            else:
                log.warning("leader election: Lease %s not renewed: %s", self.name, describe(exc))
        except Exception as exc:
            log.warning("leader election: Lease %s not renewed: %s", self.name, describe(exc))
        else:
            election.renewed(Record.from_api(answer), sent)
        finally:
            settled()

    async def _thread_tries(self, main: asyncio.AbstractEventLoop) -> None:
        assert self.thread_api is not None
        api_client = self.thread_api()

        def settled() -> None:
            main.call_soon_threadsafe(self._settle)

        try:
            await self._tries(client.CoordinationV1Api(api_client), settled)
        finally:
            await api_client.close()

    async def _stop_thread(self) -> None:
        """Stops the election thread (at its next try) and waits for it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, self.election.timing.renew_deadline + 2)

    async def attempt(self, api: client.CoordinationV1Api | None = None) -> None:
        """One read and at most one write: a take-over, or the holder's own
        renewal once its deadline has passed."""
        api = api or self.api
        assert api is not None
        election = self.election
        # Read first, always (a leader within its deadline renews in `_renew`
        # instead): a leader that was frozen finds the Lease taken and
        # writes nothing.
        election.observe(await self._read(api), self.clock())
        if not election.wants(self.clock()):
            return
        body = election.body(self.name, self.namespace, self.wall())
        sent = self.clock()
        try:
            if election.observed is None:
                answer = await call_json(
                    api.create_namespaced_lease, self.namespace, body,
                    _request_timeout=election.timing.renew_deadline,
                )  # fmt: skip
            else:
                answer = await call_json(
                    api.replace_namespaced_lease, self.name, self.namespace, body,
                    _request_timeout=election.timing.renew_deadline,
                )  # fmt: skip
        except ApiException as exc:
            if exc.status in _CHANGED:
                # Changed (or gone) since read: read it again next time.
                election.conflicted(sent)
                return
            raise
        was = election.holder()
        election.written(Record.from_api(answer), sent)
        if was and was != self.identity:
            log.info("leader election: took Lease %s over from %s", self.name, was)

    async def _read(self, api: client.CoordinationV1Api) -> Record | None:
        try:
            lease = await call_json(
                api.read_namespaced_lease, self.name, self.namespace,
                _request_timeout=self.election.timing.renew_deadline,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return Record.from_api(lease)

    async def release(self) -> None:
        """On a clean stop: stops writing, then hands the Lease back so that
        a standby takes over at its next try rather than after the lease
        duration."""
        if self.api is None:
            return
        # No renewal may follow the hand-back.
        await self._stop_thread()
        patch = self.election.release_patch(self.wall())
        was_leading = self.leading()
        self.election.step_down()
        self._settle()
        if patch is None or not was_leading:
            return
        try:
            await call_json(
                self.api.patch_namespaced_lease, self.name, self.namespace, patch,
                _content_type=JSON_PATCH, _request_timeout=2,
            )  # fmt: skip
            log.info("leader election: Lease %s handed back", self.name)
        except Exception as exc:
            log.warning(
                "leader election: Lease %s not handed back (%s); a standby takes over once "
                "it runs out", self.name, describe(exc),
            )  # fmt: skip

    # ------------------------------------------------------------ changes

    def _settle(self) -> None:
        """Tells the listeners if leading changed; arms the deadline timer.
        A replica that does not lead starts only on a lead with at least
        `Timing.least_lead` left: a renewal answered just before its own
        deadline would make it lead for a moment and stop again, each time
        re-kicking every queue (measured on a saturated API server: stops
        and starts a few tenths of a second apart)."""
        now = self.clock()
        leading = self.election.may_write(now)
        if leading and not self._leading:
            leading = self.election.leading_until - now >= self.election.timing.least_lead
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if leading:
            with contextlib.suppress(RuntimeError):
                loop = asyncio.get_running_loop()
                delay = self.election.leading_until - now
                self._timer = loop.call_later(delay, self._settle)
        if leading == self._leading:
            return
        self._leading = leading
        if self.leader_gauge is not None:
            self.leader_gauge.set(1 if leading else 0)
        if self.changes is not None:
            self.changes.inc()
        holder = self.election.holder()
        if leading:
            log.warning("leader election: %s leads now (Lease %s/%s)",
                        self.identity, self.namespace, self.name)  # fmt: skip
            self._announce("LeaderElected", f"{self.identity} leads: it places and releases")
        else:
            log.warning(
                "leader election: %s stopped leading (holder now %s); it writes nothing "
                "until it leads again", self.identity, holder or "unknown",
            )  # fmt: skip
        for started, stopped in self.listeners:
            (started if leading else stopped)()

    def _announce(self, reason: str, message: str) -> None:
        if self.announce is None:
            return
        with contextlib.suppress(RuntimeError):
            task = asyncio.get_running_loop().create_task(self.announce(reason, message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
