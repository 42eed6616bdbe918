"""Runs the plane's helm binary with its state kept inside the plane's workdir,
and renders the project's chart with it."""

from __future__ import annotations

import subprocess

from localplane import LocalPlane
from localplane.chart import CHART, RELEASE
from localplane.chart import adopt_crds as _adopt_crds
from localplane.chart import helm as _helm

__all__ = ["CHART", "RELEASE", "adopt_crds", "helm", "template"]

KUBE_VERSION = "1.34.0"


def helm(plane: LocalPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = _helm(plane, *args)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
    return proc


def template(
    plane: LocalPlane, *args: str, namespace: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as release RELEASE for KUBE_VERSION."""
    where = ("-n", namespace) if namespace else ()
    return helm(
        plane, "template", RELEASE, str(CHART), *where, "--kube-version", KUBE_VERSION, *args,
        check=check,
    )  # fmt: skip


def adopt_crds(plane: LocalPlane, namespace: str) -> None:
    """Hands the plane's CRDs over to release RELEASE in `namespace`."""
    _adopt_crds(plane, namespace, RELEASE)
