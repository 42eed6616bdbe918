"""The command line: flags where kubectl users put them, and errors that
say what is wrong with exit status 1."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from vnpu_cli.main import _parser, main


def test_flags_go_before_or_after_the_command() -> None:
    args = _parser().parse_args(["--context", "prod", "why", "p", "-n", "team-a", "-o", "json"])
    assert (args.command, args.pod, args.namespace, args.output, args.context) == (
        "why", "p", "team-a", "json", "prod",
    )  # fmt: skip
    args = _parser().parse_args(["-o", "json", "usage", "-A"])
    assert (args.output, args.all_namespaces) == ("json", True)


def test_no_kubeconfig_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    assert main(["status", "--kubeconfig", str(missing)]) == 1
    assert f"error: no kubeconfig at {missing}" in capsys.readouterr().err


def test_no_cluster_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, closed_port: int
) -> None:
    """A kubeconfig whose server nobody listens on: a sentence naming it, exit 1."""
    server = f"https://127.0.0.1:{closed_port}"
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: team-a}}}}]
current-context: x
"""
    )
    for command in (["status"], ["usage"], ["why", "p"]):
        assert main([*command, "--kubeconfig", str(kubeconfig)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot reach the cluster at {server}"), err


def test_unknown_context_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\ncurrent-context: ''\n"
    )
    assert main(["status", "--kubeconfig", str(kubeconfig), "--context", "nope"]) == 1
    assert "error: cannot use kubeconfig" in capsys.readouterr().err


def test_an_api_error_is_a_sentence(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A server that answers 401 to everything: no traceback, exit 1."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"kind":"Status","message":"Unauthorized","code":401}'
            self.send_response(401, "Unauthorized")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, *_: object) -> None:
            pass  # the client hangs up on the other lists once one fails

    server = Server(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "config"
        kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{server.server_address[1]}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
        )
        assert main(["status", "--kubeconfig", str(kubeconfig)]) == 1
        assert capsys.readouterr().err == "error: the API server answered 401 Unauthorized\n"
    finally:
        server.shutdown()


def test_version_and_the_agent_namespace_variable_in_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"kubectl-vnpu {version('vnpu-operator')}\n"
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "$VNPU_AGENT_NAMESPACE or vnpu-system" in " ".join(capsys.readouterr().out.split())
