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

import pytest

import demo
from localplane import LocalPlane
from storycheck import check_story

pytestmark = [pytest.mark.plane, pytest.mark.e2e]


def test_the_demo_story_holds(tmp_path: Path) -> None:
    check_story(LocalPlane(tmp_path), tmp_path, demo.story, "the demo's story")
