"""The Helm chart on the local plane: helm with the plane's kubeconfig, CRD
adoption, and the values that put the chart's pods on the real node.

The chart tests (kwok nodes, and the real node) and `make demo-node` install
the chart through these, so the three use one set of values for one setup.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from localplane.plane import REPO_ROOT, LocalPlane, PlaneError
from localplane.productimage import ProductImage
from localplane.realnode import ASCEND_HANDLER, POD_GATEWAY, REAL_NODE_LABEL, RealNode
from vnpu_common.wire import names

CHART = REPO_ROOT / "charts" / "vnpu-operator"
RELEASE = "vnpu-operator"
CRDS = (f"{names.ALLOCATION_PLURAL}.{names.GROUP}", f"{names.NODE_PLURAL}.{names.GROUP}")


def helm(plane: LocalPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """The plane's helm (built with it) against the plane, with its caches in
    the plane's workdir; never raises for helm's exit status."""
    return subprocess.run(
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
        check=False,
    )


def helm_ok(plane: LocalPlane, *args: str) -> str:
    """helm, raising PlaneError with helm's own words if it fails; its stdout."""
    proc = helm(plane, *args)
    if proc.returncode != 0:
        raise PlaneError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def adopt_crds(plane: LocalPlane, namespace: str, release: str = RELEASE) -> None:
    """Hands CRDs applied with kubectl (the local plane applies them at start),
    or kept by an earlier release's uninstall, over to `release` in
    `namespace`: the adoption docs/HELM.md documents."""
    for crd in CRDS:
        plane.kubectl("label", "crd", crd, "app.kubernetes.io/managed-by=Helm", "--overwrite")
        plane.kubectl(
            "annotate",
            "crd",
            crd,
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
            "--overwrite",
        )


def real_node_values(
    plane: LocalPlane,
    node: RealNode,
    image: ProductImage | None,
    *,
    runtime_class: str,
    chips: str,
    state_dir: Path,
    cdi_dir: Path,
) -> dict[str, Any]:
    """Chart values for the real node: the imported image, the operator and a sim
    agent on that node only, device nodes where the Ascend runtime stand-in looks,
    and the API server at the bridge's gateway (there is no kube-proxy). With no `image`,
    the chart's own image values stand (a release's chart package pins its image)."""
    values: dict[str, Any] = {
        "apiServer": {"host": POD_GATEWAY, "port": plane.ports.apiserver},
        "runtimeClassName": runtime_class,
        "runtimeClass": {"create": True, "handler": ASCEND_HANDLER},
        "operator": {"nodeSelector": {REAL_NODE_LABEL: "true"}},
        "agent": {
            "driver": "sim",
            "simChips": chips,
            "simDeviceDir": str(node.device_dir),
            "nodeSelector": {names.LABEL_NPU_NODE: "true", REAL_NODE_LABEL: "true"},
            # Host paths of this run only: an earlier run's sim state must not count.
            "hostPaths": {"state": str(state_dir), "cdi": str(cdi_dir)},
        },
    }
    if image is not None:
        values["image"] = {"repository": image.repository, "tag": image.tag, "pullPolicy": "Never"}
    return values
