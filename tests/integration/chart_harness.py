"""Runs the plane's helm binary with its state kept inside the plane's workdir,
and renders the project's chart with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from localplane import LocalPlane
from vnpu_common import names

CHART = Path(__file__).resolve().parents[2] / "charts" / "vnpu-operator"
RELEASE = "vnpu-operator"
KUBE_VERSION = "1.34.0"
CRDS = (f"{names.ALLOCATION_PLURAL}.{names.GROUP}", f"{names.NODE_PLURAL}.{names.GROUP}")


def helm(plane: LocalPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [plane.binary("helm"), *args],
        capture_output=True,
        text=True,
        env={
            **plane.env(),
            "HELM_CACHE_HOME": str(plane.workdir / "helm-cache"),
            "HELM_CONFIG_HOME": str(plane.workdir / "helm-config"),
            "HELM_DATA_HOME": str(plane.workdir / "helm-data"),
        },
        timeout=300,
    )
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
    """Hands CRDs applied with kubectl (the session plane), or kept by an
    earlier release's uninstall, over to release RELEASE in `namespace`: the
    adoption docs/HELM.md documents."""
    for crd in CRDS:
        plane.kubectl("label", "crd", crd, "app.kubernetes.io/managed-by=Helm", "--overwrite")
        plane.kubectl(
            "annotate",
            "crd",
            crd,
            f"meta.helm.sh/release-name={RELEASE}",
            f"meta.helm.sh/release-namespace={namespace}",
            "--overwrite",
        )
