"""The chart under Helm v4 as under Helm v3 (docs/OPERATIONS.md, "GitOps with Argo CD":
newer Argo CD releases render with Helm v4): `helm lint --strict` passes with both, and
`helm template` gives the same objects, each one's YAML identical line for line (Helm v4
orders the documents of a file differently and keeps blank lines v3 drops), for the
defaults and for the settings that read the cluster's version and APIs. Helm v3 is the
plane's; Helm v4 is built from its module (hack/tools, `make release-tools`).

The facts the documents are checked against (hack/docfacts, tests/unit/docs/test_doc_facts.py)
are read from the templates' source; here they are compared with the rendered chart.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from docfacts import chart_facts
from localplane.chart import CHART, RELEASE
from localplane.plane import bin_dir

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "vnpu-system"

SETTINGS = {
    "defaults": ("--kube-version", "1.34.0"),
    "dra": (
        "--set", "agent.dra=true", "--kube-version", "1.36.0",
        "--api-versions", "resource.k8s.io/v1/DeviceClass",
    ),
    "cert-manager": (
        "--set", "webhook.certSource=cert-manager", "--api-versions", "cert-manager.io/v1",
        "--kube-version", "1.34.0",
    ),
    "monitoring": (
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.prometheusRule.enabled=true",
        "--set", "metrics.grafanaDashboard.enabled=true",
        "--api-versions", "monitoring.coreos.com/v1", "--kube-version", "1.34.0",
    ),
    "one replica, sim": (
        "--set", "operator.replicas=1", "--set", "agent.driver=sim",
        "--set", "agent.simChips=910B3=2", "--kube-version", "1.30.0",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def helms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each Helm as a command, its caches in a folder of its own."""
    v3 = bin_dir() / "helm"
    assert v3.is_file(), "the plane's helm is not built: make plane"
    built = subprocess.run(
        ["bash", str(ROOT / "hack" / "tools" / "build.sh"), "helm4"],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert built.returncode == 0, f"hack/tools/build.sh helm4 failed:\n{built.stderr[-3000:]}"
    v4 = Path(built.stdout.strip().splitlines()[-1])
    out = {}
    for name, binary in (("v3", v3), ("v4", v4)):
        home = tmp_path_factory.mktemp(f"helm-{name}")
        out[name] = [
            "env", f"HELM_CACHE_HOME={home}/cache", f"HELM_CONFIG_HOME={home}/config",
            f"HELM_DATA_HOME={home}/data", str(binary),
        ]  # fmt: skip
    version = subprocess.run([*out["v4"], "version", "--short"], capture_output=True, text=True)
    assert version.stdout.startswith("v4."), version.stdout + version.stderr
    return out


def run(helm: list[str], *args: str) -> str:
    proc = subprocess.run([*helm, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}"
    return proc.stdout


def documents(rendered: str) -> dict[tuple[str, str, str], str]:
    """(kind, namespace, name) -> that object's YAML, blank lines and trailing spaces
    dropped (the difference between the two Helms' output that is not an object's)."""
    out = {}
    for chunk in rendered.split("\n---\n"):
        lines = [line.rstrip() for line in chunk.strip("-\n").splitlines() if line.strip()]
        text = "\n".join(lines)
        doc: Any = yaml.safe_load(text) if text else None
        if not doc:
            continue
        meta = doc["metadata"]
        key = (doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"rendered twice: {key}"
        out[key] = text
    return out


LINT_VALUES = (
    (),
    ("--set", "agent.driver=sim", "--set", "agent.simChips=910B3=2",
     "--set", "metrics.serviceMonitor.enabled=true", "--set", "operator.replicas=1"),
)  # fmt: skip


def test_helm_lint_passes_with_v3_and_v4(helms: dict[str, list[str]]) -> None:
    for name, helm in helms.items():
        for values in LINT_VALUES:
            out = run(helm, "lint", "--strict", str(CHART), *values)
            assert "1 chart(s) linted, 0 chart(s) failed" in out, f"{name} {values}: {out}"


@pytest.mark.parametrize("setting", SETTINGS)
def test_helm_v4_renders_what_helm_v3_renders(helms: dict[str, list[str]], setting: str) -> None:
    args = ("template", RELEASE, str(CHART), "-n", NAMESPACE, *SETTINGS[setting])
    v3, v4 = (documents(run(helms[name], *args)) for name in ("v3", "v4"))
    assert sorted(v4) == sorted(v3)
    differing = [key for key in v3 if v3[key] != v4[key]]
    assert differing == [], f"objects whose YAML differs between Helm v3 and v4: {differing}"


def _objects(rendered: str) -> Iterator[dict[str, Any]]:
    yield from (d for d in yaml.safe_load_all(rendered) if d)


def test_the_facts_the_docs_are_checked_against_are_the_renders(
    helms: dict[str, list[str]],
) -> None:
    facts = chart_facts()
    rendered = run(
        helms["v3"], "template", RELEASE, str(CHART), "-n", NAMESPACE, *SETTINGS["defaults"]
    )
    objects = list(_objects(rendered))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == facts.operator_replicas
    assert spec["strategy"]["type"] == facts.operator_strategy
    rolling = spec["strategy"]["rollingUpdate"]
    assert (str(rolling["maxSurge"]), str(rolling["maxUnavailable"])) == (
        facts.operator_max_surge,
        facts.operator_max_unavailable,
    )
    pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert bool(pdbs) == facts.pdb_by_default
    protection = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"].endswith("-protection")
    ]
    assert len(protection) == facts.protection_policies, protection
    # The Kubernetes floors the docs are held to are where the chart starts to render:
    # the chart's own, and DRA's.
    for floor, extra in ((facts.kube_floor, ()), (facts.dra_floor, ("--set", "agent.dra=true"))):
        args = ("template", RELEASE, str(CHART), *extra, "--kube-version")
        run(helms["v3"], *args, f"{floor}.0")
        below = subprocess.run(
            [*helms["v3"], *args, _previous_minor(floor)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert below.returncode != 0, f"renders below {floor}"
        assert floor in below.stderr, below.stderr


def _previous_minor(version: str) -> str:
    major, minor = version.split(".")
    return f"{major}.{int(minor) - 1}.0"
