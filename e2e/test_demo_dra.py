"""End to end: the claim story `make demo-dra` tells, run as a test (`make test` runs it;
`make test-e2e` alone).

The demo checks its own outcomes as it goes (e2e/demo_dra.py raises DemoError on the first
that is not as shown): a DRA node's agent publishes its pool (devices per template,
counters per chip); two claim pods are each allocated a device of their own, served by a
Ready VNPUAllocation naming their claim, and bound no earlier than the binding condition
vnpu.io/vnpu-ready turned True; a cordoned chip withdraws its devices and a pod tolerating
every taint lands on the other chip; the chart's dra-admission policies refuse an
adminAccess claim and a pod asking for the DeviceClass as an extended resource; after the
pods go no claim, no allocation and no simulated vNPU is left. Here, on top: the agent and
the operator are still running when the story ends and exit 0 on SIGTERM.

Like e2e/test_demo.py, the story starts a plane of its own (its node, its policies, `-A`
listings that must end empty) instead of the session's `plane`; it needs the main lane
(Kubernetes 1.36 or later) and fails, saying so, on an older one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import demo
import demo_dra
from localplane import LocalPlane

pytestmark = [pytest.mark.plane, pytest.mark.e2e]


def test_the_dra_demo_story_holds(tmp_path: Path) -> None:
    plane = LocalPlane(tmp_path)
    version = tuple(int(x) for x in plane.k8s_version.lstrip("v").split(".")[:2])
    if version < (1, 36):
        pytest.fail(
            f"the DRA demo needs Kubernetes 1.36 or later, this lane is {version}: run it on "
            "the main lane (make test-e2e)"
        )
    procs: dict[str, Any] = {}
    try:
        plane.start(progress=lambda msg: print(f"[localplane] {msg}"))
        try:
            demo_dra.story(plane, tmp_path, procs)
        except demo.DemoError as exc:
            tails = "\n".join(
                f"--- {name} log tail ({proc.log_path})\n{demo.log_tail(proc.log_path)}"
                for name, proc in procs.items()
            )
            pytest.fail(f"the DRA demo's story broke: {exc}\n{tails}")
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
