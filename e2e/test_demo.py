"""End to end: the story `make demo` tells, run as a test (`make test` runs it; `make
test-e2e` alone).

The demo checks its own outcomes as it goes (e2e/demo.py raises DemoError on the first
that is not as shown): the webhook refuses a bad template and an over-quota pod, a pod
waits for capacity and is placed when another ends, a vNPU nobody touches is kept while a
leaked one is collected, a cordoned chip is skipped until uncordoned, and after the last
delete no allocation, no inventory vNPU and no simulated vNPU is left. Here, on top: the
agent and the operator are still running when the story ends and exit 0 on SIGTERM.

The story needs a cluster of its own (its three nodes, its webhooks, `-A` listings that
must end empty), so it starts a plane of its own instead of the session's `plane`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import demo
from localplane import LocalPlane

pytestmark = [pytest.mark.plane, pytest.mark.e2e]


def test_the_demo_story_holds(tmp_path: Path) -> None:
    plane = LocalPlane(tmp_path)
    procs: dict[str, Any] = {}
    try:
        plane.start(progress=lambda msg: print(f"[localplane] {msg}"))
        try:
            demo.story(plane, tmp_path, procs)
        except demo.DemoError as exc:
            tails = "\n".join(
                f"--- {name} log tail ({proc.log_path})\n{demo.log_tail(proc.log_path)}"
                for name, proc in procs.items()
            )
            pytest.fail(f"the demo's story broke: {exc}\n{tails}")
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
