"""Pytest fixtures: one control plane per session, a fresh namespace per test.

A test that asks for `plane` and finds no binaries fails with the command
that builds them; it never skips (`make test` builds them first).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localplane.plane import LocalPlane
from localplane.waiting import wait_for


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    workdir = Path(tmp_path_factory.mktemp("plane"))
    p = LocalPlane(workdir)
    p.start(progress=lambda msg: print(f"[localplane] {msg}"))
    p.install_crds()
    yield p
    p.stop()
    if os.environ.get("VNPU_KEEP_PLANE") != "1":
        p.rmtree()


@pytest.fixture
def namespace(plane: LocalPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards (without waiting)."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{base}-{uuid.uuid4().hex[:6]}".strip("-")
    plane.kubectl("create", "namespace", name)
    # Pods are refused until the controller-manager has made the namespace's
    # default ServiceAccount: usually at once, but after an API server restart
    # (tests of issue 12 do that) its informers reconnect with a backoff.
    wait_for(
        f"ServiceAccount default in {name}",
        lambda: (
            plane.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=60,
    )
    yield name
    plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
