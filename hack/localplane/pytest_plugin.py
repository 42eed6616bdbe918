"""Pytest fixtures: one control plane per session, a fresh namespace per test.

A test that asks for `plane` and finds no binaries fails with the command
that builds them; it never skips (`make test` builds them first).

The plane runs the Kubernetes lane of `--k8s-lane` (or `$VNPU_K8S_LANE`): the main
lane of hack/plane/versions.env by default, `1.34` for the older one. Tests whose
outcome depends on the API server's or the scheduler's version carry the marker
`k8s134`; `make test-k8s134` (part of `make test`) runs them again on the 1.34 lane.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localplane.plane import LANE_ENV, LocalPlane, default_lane, lane_version
from localplane.waiting import wait_for


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--k8s-lane",
        default=None,
        help=f"Kubernetes lane of the session's plane, e.g. 1.34 (default: ${LANE_ENV}, "
        "else the main lane of hack/plane/versions.env)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Every plane of the session (the fixture's, and those tests start themselves)
    # runs the chosen lane.
    lane = config.getoption("--k8s-lane")
    if lane:
        os.environ[LANE_ENV] = lane


def pytest_report_header(config: pytest.Config) -> str:
    lane = default_lane()
    return f"local plane: Kubernetes lane {lane} ({lane_version(lane)})"


@pytest.fixture(scope="session")
def k8s_lane() -> str:
    """The Kubernetes lane the session's planes run ("1.37", "1.34")."""
    return default_lane()


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory, k8s_lane: str) -> Iterator[LocalPlane]:
    workdir = Path(tmp_path_factory.mktemp("plane"))
    p = LocalPlane(workdir, lane=k8s_lane)
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
