"""The chart's protection policies, rendered for the local plane.

The chart's ValidatingAdmissionPolicies exempt the operator by its username. In a
cluster that is its ServiceAccount's; the local plane runs the operator with a client
certificate of its own (`OPERATOR_USER`), so the same templates are rendered with that
username (`helm template --show-only`): one source for the chart and the plane, and a
change to the chart's policies reaches every test, the demo and the benchmark.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from vnpu_common.wire import names

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "vnpu-operator"
VERSIONS = REPO_ROOT / "hack" / "plane" / "versions.env"


def templates() -> list[str]:
    """Every protection policy of the chart: templates/protection*.yaml, one file a
    concern, so that a new policy file reaches the plane without a list to keep."""
    return sorted(f"templates/{p.name}" for p in (CHART / "templates").glob("protection*.yaml"))


# The RuntimeClass of the real node's Ascend runtime stand-in (localplane.realnode): the
# device policy lets only pods that ask for vNPUs name it.
ASCEND_RUNTIME_CLASS = "ascend"

# The CN of the operator's client certificate on the local plane.
OPERATOR_USER = "vnpu-operator"
# ... and of the agents': the allocation policy lets only the two and the garbage
# collector change an allocation, where an admin may only remove its finalizer.
AGENT_USER = "vnpu-agent"
# Names the objects apart from a release of the chart installed on the same plane.
RELEASE = "vnpu-localplane"

# What the allocation policy answers an allocation created by anyone but the operator:
# the local plane waits for it to know the policies are enforced.
NOT_THE_OPERATOR = "VNPUAllocations are created by the vnpu-operator only"


def kube_version(key: str = "K8S_VERSION") -> str:
    """A Kubernetes version of versions.env: the main lane's (`K8S_VERSION`) or the older
    lane's (`K8S_LEGACY_VERSION`). Helm built from source assumes 1.20, which the chart's
    kubeVersion refuses, so the policies are rendered for the plane's own."""
    for line in VERSIONS.read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            return value.strip()
    raise RuntimeError(f"no {key} in {VERSIONS}")


def settings() -> list[str]:
    """The chart values the plane's policies are rendered with: who the local operator
    and agents are, and the real node's Ascend RuntimeClass."""
    return [
        "--set", f"protection.operatorUsername={OPERATOR_USER}",
        "--set", f"runtimeClassName={ASCEND_RUNTIME_CLASS}",
        "--set", f"protection.agentUsernames={{{AGENT_USER}}}",
    ]  # fmt: skip


def render(helm: str, home: Path, version: str | None = None) -> str:
    """The policy manifests, for the local operator's username and the plane's
    Kubernetes `version` (the main lane's by default). `home` keeps helm's cache and
    config (it writes there even for `template`)."""
    show = [arg for t in templates() for arg in ("--show-only", t)]
    proc = subprocess.run(
        [
            helm,
            "template",
            RELEASE,
            str(CHART),
            *show,
            "--kube-version",
            version or kube_version(),
            "--set",
            f"fullnameOverride={RELEASE}",
            *settings(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": str(Path(helm).parent),
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        },
    )
    if proc.returncode != 0:
        raise RuntimeError(f"helm template of the protection policies failed: {proc.stderr}")
    return proc.stdout


def probe_allocation() -> dict[str, Any]:
    """An allocation that passes every check but who creates it: created with
    `--dry-run=server` by someone other than the operator, it is refused exactly while
    the allocation policy is enforced."""
    node = "vnpu-policy-probe"
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {"name": "vnpu-policy-probe", "labels": {names.LABEL_NODE: node}},
        "spec": {
            "podName": "probe",
            "podUID": "probe",
            "nodeName": node,
            "chip": 0,
            "template": "vir05_1c_16g",
            "vnpuId": names.VNPU_ID_MIN,
        },
    }
