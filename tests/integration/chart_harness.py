"""Runs the plane's helm binary with its state kept inside the plane's workdir."""

from __future__ import annotations

import subprocess

from localplane import LocalPlane


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
