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

import pytest

import demo_dra
from localplane import LocalPlane
from storycheck import check_story

pytestmark = [pytest.mark.plane, pytest.mark.e2e]


def test_the_dra_demo_story_holds(tmp_path: Path) -> None:
    plane = LocalPlane(tmp_path)
    version = tuple(int(x) for x in plane.k8s_version.lstrip("v").split(".")[:2])
    if version < (1, 36):
        pytest.fail(
            f"the DRA demo needs Kubernetes 1.36 or later, this lane is {version}: run it on "
            "the main lane (make test-e2e)"
        )
    check_story(plane, tmp_path, demo_dra.story, "the DRA demo's story")
