"""What both commands check before they start: where the API server is and
that their ports are free. A start that cannot go on is one line naming the
setting to fix and exit status 1 (`StartupError` is a SystemExit), not a
traceback of the client library or the event loop."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from kubernetes_asyncio import config
from kubernetes_asyncio.config.config_exception import ConfigException


class StartupError(SystemExit):
    """`prog: message` on stderr, exit status 1."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{prog}: {message}")


def _require_file(prog: str, kubeconfig: Path) -> None:
    # Before the client reads it: its own error is a traceback of yaml loading.
    if not kubeconfig.is_file():
        raise StartupError(prog, f"--kubeconfig (VNPU_KUBECONFIG) {kubeconfig}: no such file")


async def load_kube_config(prog: str, kubeconfig: Path | None) -> None:
    """The client's configuration: the --kubeconfig file, else the pod's
    in-cluster ServiceAccount."""
    if kubeconfig is not None:
        _require_file(prog, kubeconfig)
        try:
            await config.load_kube_config(config_file=str(kubeconfig))
        except (ConfigException, OSError, ValueError) as exc:
            raise StartupError(prog, f"--kubeconfig {kubeconfig} is not usable: {exc}") from None
        return
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        where = (
            "KUBERNETES_SERVICE_HOST is not set"
            if not os.environ.get("KUBERNETES_SERVICE_HOST")
            else str(exc)
        )
        raise StartupError(
            prog,
            "no cluster to talk to: give --kubeconfig (VNPU_KUBECONFIG) outside a cluster; "
            f"in a pod the ServiceAccount's configuration is used, but {where}",
        ) from None


def check_port(prog: str, host: str, port: int, setting: str) -> None:
    """Fails when `host:port` cannot be listened on (another process has it,
    or the address is not this machine's); 0 means no port."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As asyncio's servers do: a port in TIME_WAIT is free, a listening one not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise StartupError(
                prog, f"cannot listen on {host}:{port} ({setting}): {exc.strerror or exc}"
            ) from None
