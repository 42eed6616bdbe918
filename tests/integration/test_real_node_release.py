"""A release installed on the real node from its own files alone: `python -m release`
(what `make release` runs) for this host's platform, the release directory copied away
from the source tree and checked there with docs/RELEASING.md's verify command, its
image archive imported into the node's containerd as docs/RELEASING.md says, and its
chart package installed with no image values: the chart's own digest must find the
image. Then a pod gets its vNPU.

The release is built with ALLOW_DIRTY=1 (a developer's tree may have changes; in CI it is
clean), for the host's platform only (`make release` builds both), and with
RELEASE_LABELS=0: its image is then the one `make image` built for the real-node lane,
unlabelled, instead of a second build of the last stage with the commit in its labels
(about 100 s). Needs root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import RELEASE, helm
from realnode_harness import check_devices, ready_for_release, running, vnpu_busybox_pod
from release_harness import run_verify

from localplane.chart import real_node_values
from localplane.plane import LocalPlane
from localplane.realnode import RealNode
from localplane.waiting import wait_for
from release import build, version
from vnpu_common.wire import names

pytestmark = [pytest.mark.plane, pytest.mark.realnode]

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "vnpu-release"
WORK = "vnpu-release-work"
RUNTIME_CLASS = "vnpu-ascend-release"
CHIPS = "910B3=1"
COMPONENT = "app.kubernetes.io/component"


@dataclass
class Installed:
    node: RealNode
    release_dir: Path  # the copy, outside the source tree
    meta: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def _ready_pods(plane: LocalPlane, component: str) -> list[dict[str, Any]]:
    pods = plane.get_json("pods", "-n", NAMESPACE, "-l", f"{COMPONENT}={component}")["items"]
    return [
        p
        for p in pods
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    ]


def _wait_ready(plane: LocalPlane, component: str, count: int) -> None:
    try:
        wait_for(
            f"{count} {component} pod(s) Ready",
            lambda: len(_ready_pods(plane, component)) >= count,
            240,
            interval=0.5,
        )
    except AssertionError:
        pods = plane.get_json("pods", "-n", NAMESPACE)["items"]
        events = plane.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout
        raise AssertionError(
            f"{component} not Ready: {[p.get('status') for p in pods]}\n{events[-4000:]}"
        ) from None


@pytest.fixture(scope="module")
def installed(
    plane: LocalPlane, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    tmp = Path(tmp_path_factory.mktemp("release"))
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "hack"),
        "PYTHON": sys.executable,
        "PLATFORMS": build.host_platform(),
        "RELEASE_DIR": str(tmp / "dist"),
        "ALLOW_DIRTY": "1",
        # `make image`'s archive, which the real-node lane has built: a cache hit.
        "RELEASE_LABELS": "0",
    }
    env.pop("RELEASE_SIGNING_KEY", None)
    proc = subprocess.run([sys.executable, "-m", "release"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    print(proc.stderr[-6000:])
    assert proc.returncode == 0, proc.stderr[-6000:]
    built = Path(proc.stdout.strip().splitlines()[-1])
    timings["make_release"] = time.monotonic() - t0

    # Only the release directory goes on: nothing below reads the source tree.
    copy = tmp / "elsewhere" / built.name
    shutil.copytree(built, copy)
    shutil.rmtree(built)
    meta = json.loads((copy / "release.json").read_text())
    t0 = time.monotonic()
    verified = run_verify(copy)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    timings["verify"] = time.monotonic() - t0

    archive = (
        copy / f"vnpu-operator-{meta['version']}-{build.host_platform().replace('/', '-')}.oci.tar"
    )
    t0 = time.monotonic()
    real_node.import_image(archive)
    timings["image_import"] = time.monotonic() - t0

    ready_for_release(plane, real_node, NAMESPACE, WORK)
    real_node.add_davinci_manager()
    values = real_node_values(
        plane, real_node, None, runtime_class=RUNTIME_CLASS, chips=CHIPS,
        state_dir=tmp / "agent-state", cdi_dir=tmp / "cdi",
    )  # fmt: skip
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    chart = copy / meta["chart"]
    result = Installed(real_node, copy, meta, timings)
    try:
        t0 = time.monotonic()
        helm(plane, "install", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(values_file))
        _wait_ready(plane, "agent", 1)
        _wait_ready(plane, "operator", 2)
        timings["helm_install_to_ready"] = time.monotonic() - t0
        yield result
    finally:
        print(f"[realnode-release] timings: {timings}")
        plane.kubectl("delete", "pods", "--all", "-n", WORK, "--wait=false", check=False)
        wait_for(
            "the release's allocations gone",
            lambda: not plane.get_json("vnpuallocations", "-n", WORK)["items"],
            120,
            interval=0.5,
        )
        helm(plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s",
             check=False)  # fmt: skip
        plane.install_policies()
        plane.kubectl("label", "node", real_node.name, f"{names.LABEL_NPU_NODE}-", check=False)
        for ns in (WORK, NAMESPACE):
            plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_the_release_runs_its_own_image_by_digest(plane: LocalPlane, installed: Installed) -> None:
    digest = installed.meta["image"]["digest"]
    tag = installed.meta["version"]
    assert tag == version.project_version(ROOT)
    expected = f"vnpu-operator@{digest}"
    for kind, name in (("deployment", "operator"), ("daemonset", "agent")):
        obj = plane.get_json(kind, f"{RELEASE}-{name}", "-n", NAMESPACE)
        (container,) = obj["spec"]["template"]["spec"]["containers"]
        assert container["image"] == expected, kind
        assert container["imagePullPolicy"] == "IfNotPresent", kind
    for component in ("operator", "agent"):
        for pod in _ready_pods(plane, component):
            (status,) = pod["status"]["containerStatuses"]
            assert status["restartCount"] == 0, component
            assert status["imageID"].endswith(digest), status
    # containerd holds the image under both names the archive gives it, nothing pulled.
    listed = installed.node.ctr("images", "ls", "-q").stdout.split()
    assert f"docker.io/library/vnpu-operator:{tag}" in listed
    assert f"docker.io/library/vnpu-operator@{digest}" in listed


def test_a_pod_gets_its_vnpu_from_the_release(plane: LocalPlane, installed: Installed) -> None:
    t0 = time.monotonic()
    plane.apply(vnpu_busybox_pod("from-release", WORK, 1))
    pod = running(plane, WORK, "from-release", timeout=120)
    installed.timings["vnpu_pod_to_running"] = time.monotonic() - t0
    assert pod["spec"]["nodeName"] == installed.node.name
    (vnpu,) = check_devices(plane, WORK, pod)
    alloc = plane.get_json("vnpuallocations", "-n", WORK)["items"]
    assert [a["spec"]["vnpuId"] for a in alloc] == [vnpu]
    assert alloc[0]["status"]["phase"] == names.PHASE_READY


def test_the_sbom_lists_the_images_debian_and_python_packages(installed: Installed) -> None:
    arch = build.host_platform().replace("/", "-")
    sbom = installed.release_dir / f"vnpu-operator-{installed.meta['version']}-{arch}.spdx.json"
    doc = json.loads(sbom.read_text())
    assert doc["spdxVersion"] == "SPDX-2.3"
    kinds = build.sbom_packages(sbom)
    # Debian's interpreter of the Dockerfile, and the lock's dependencies with the project.
    assert {"python3.11", "libc6", "dpkg"} <= kinds["deb"], sorted(kinds["deb"])[:20]
    assert {"kopf", "kubernetes-asyncio", "pydantic", "vnpu-operator"} <= kinds["pypi"]
