"""What the end-to-end tests check of a demo's story (e2e/test_demo.py,
e2e/test_demo_dra.py): it runs to its end on a plane of its own, the agent and
the operator are still running then, and each exits 0 on SIGTERM."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import demo
from localplane import LocalPlane

Story = Callable[[LocalPlane, Path, dict[str, Any]], None]


def check_story(plane: LocalPlane, workdir: Path, story: Story, what: str) -> None:
    """Starts `plane`, tells `story` on it and fails with the components' log
    tails if it breaks; `what` names the story in that message."""
    procs: dict[str, Any] = {}
    try:
        plane.start(progress=lambda msg: print(f"[localplane] {msg}"))
        try:
            story(plane, workdir, procs)
        except demo.DemoError as exc:
            tails = "\n".join(
                f"--- {name} log tail ({proc.log_path})\n{demo.log_tail(proc.log_path)}"
                for name, proc in procs.items()
            )
            pytest.fail(f"{what} broke: {exc}\n{tails}")
        for name, proc in procs.items():
            assert proc.proc is not None, f"the {name} was never started"
            assert proc.proc.poll() is None, (
                f"the {name} exited with {proc.proc.returncode} during the story:\n"
                f"{demo.log_tail(proc.log_path)}"
            )
        # Each exits 0 on SIGTERM, or kill() raises with the log's tail.
        demo.stop(procs)
    finally:
        for proc in procs.values():
            proc.stop()
        plane.stop()
