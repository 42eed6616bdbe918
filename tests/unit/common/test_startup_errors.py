"""A start that cannot go on is one line and exit status 1, for both
commands: no cluster configuration, a --kubeconfig that does not exist, the
metrics or webhook port taken by another process (vnpu_common.process.startup).
Run as the console scripts are, in a subprocess, so that nothing the event
loop or the client library prints on the way out escapes the check."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

OPERATOR = [sys.executable, "-m", "vnpu_operator.main"]
AGENT = [sys.executable, "-m", "vnpu_agent.main", "--node-name=n1"]


def _run(argv: list[str], tmp_path: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "VNPU_"))}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config to fall back on
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False
    )
    return proc.returncode, proc.stderr


def _one_line(rc: int, err: str, prog: str) -> str:
    assert rc == 1, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: "), err
    return lines[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(("prog", "argv"), [("vnpu-operator", OPERATOR), ("vnpu-agent", AGENT)])
def test_no_cluster_configuration(prog: str, argv: list[str], tmp_path: Path) -> None:
    args = [*argv, "--metrics-port=0"]
    if prog == "vnpu-operator":
        args.append(f"--webhook-port={_free_port()}")
    line = _one_line(*_run(args, tmp_path), prog)
    assert "no cluster to talk to: give --kubeconfig (VNPU_KUBECONFIG)" in line
    assert "KUBERNETES_SERVICE_HOST is not set" in line


@pytest.mark.parametrize(("prog", "argv"), [("vnpu-operator", OPERATOR), ("vnpu-agent", AGENT)])
def test_a_kubeconfig_that_does_not_exist(prog: str, argv: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "kubeconfig"
    args = [*argv, "--metrics-port=0", f"--kubeconfig={missing}"]
    if prog == "vnpu-operator":
        args.append(f"--webhook-port={_free_port()}")
    line = _one_line(*_run(args, tmp_path), prog)
    assert line == f"{prog}: --kubeconfig (VNPU_KUBECONFIG) {missing}: no such file"


@pytest.mark.parametrize(
    ("prog", "argv", "flag"),
    [
        ("vnpu-operator", OPERATOR, "--metrics-port"),
        ("vnpu-operator", [*OPERATOR, "--metrics-port=0"], "--webhook-port"),
        ("vnpu-agent", AGENT, "--metrics-port"),
    ],
)
def test_a_port_in_use(
    prog: str, argv: list[str], flag: str, taken_port: int, tmp_path: Path
) -> None:
    args = [*argv, "--metrics-host=127.0.0.1", f"{flag}={taken_port}"]
    if prog == "vnpu-operator":
        args.append("--webhook-host=127.0.0.1")
    line = _one_line(*_run(args, tmp_path), prog)
    assert line.startswith(f"{prog}: cannot listen on 127.0.0.1:{taken_port} ({flag}): "), line
    assert "in use" in line, line
