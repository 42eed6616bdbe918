"""A stand-in for the webhook Service in front of several operator replicas.

A local plane's API server calls the webhooks by URL (there is no Service
and no kube-proxy), so two OperatorProcess replicas need one address that
reaches whichever of them is Ready: this proxy listens on one loopback port
and passes each TCP connection (TLS and all, untouched) to a replica whose
/readyz answered 200 at the last poll, as a Service's endpoints hold the
Ready pods. Polled every `interval` s (a cluster: the readiness probe's
period plus the endpoint's propagation, about a second or more).

One difference, more lenient than kube-proxy: a replica that refuses the
connection (killed since the last poll) is skipped for the next Ready one.
In a cluster a connection to a pod killed a moment ago is refused until its
endpoint goes (about a second), and the API server does not retry a refused
webhook call: docs/HELM.md ("High availability") says what an admin sees.
Counted here as `skipped`.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence

from localplane.plane import free_port


class Backend:
    def __init__(self, webhook_port: Callable[[], int], ready_port: Callable[[], int]) -> None:
        self.webhook_port = webhook_port
        self.ready_port = ready_port


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _pump(src: socket.socket, dst: socket.socket) -> int:
    """Copies until EOF or an error; returns the bytes copied."""
    copied = 0
    try:
        while data := src.recv(65536):
            dst.sendall(data)
            copied += len(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
    return copied


class WebhookProxy:
    """`backends`: each replica's webhook port and /readyz port, read at each
    use (an OperatorProcess gets a fresh metrics port on every start)."""

    def __init__(self, backends: Sequence[Backend], *, interval: float = 0.5) -> None:
        self.backends = list(backends)
        self.interval = interval
        self.port = free_port()
        self.ready: list[Backend] = []
        self.connections = 0
        self.skipped = 0
        self.unserved = 0
        # What went wrong, with a wall-clock time, for a test's failure message.
        self.events: list[str] = []
        self._stop = threading.Event()
        self._rr = itertools.count()
        self._server = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self._threads = [
            threading.Thread(target=self._poll, name="proxy-poll", daemon=True),
            threading.Thread(target=self._accept, name="proxy-accept", daemon=True),
        ]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> WebhookProxy:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.close()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.ready = [b for b in self.backends if _ready(b.ready_port())]
            self._stop.wait(self.interval)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        ready = list(self.ready)
        start = next(self._rr)
        for i in range(len(ready)):
            backend = ready[(start + i) % len(ready)]
            try:
                upstream = socket.create_connection(
                    ("127.0.0.1", backend.webhook_port()), timeout=2
                )
            except OSError:
                self.skipped += 1
                continue
            upstream.settimeout(None)
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            if _pump(upstream, client) == 0:
                self._event(f"replica on :{backend.webhook_port()} closed without answering")
            upstream.close()
            client.close()
            return
        self.unserved += 1
        self._event(f"no Ready replica took the connection (Ready at the last poll: {len(ready)})")
        client.close()

    def _event(self, what: str) -> None:
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f"{now % 1:.3f}"[1:]
        self.events.append(f"{stamp} {what}")
