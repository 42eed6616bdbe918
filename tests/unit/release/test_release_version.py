"""The release's one version: pyproject.toml defines it, every other place repeats it,
and it is SemVer (hack/release/version.py; docs/RELEASING.md)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from release import version

ROOT = Path(__file__).resolve().parents[3]


def test_every_place_carries_the_project_version_and_it_is_semver() -> None:
    assert version.problems(ROOT) == []
    v = version.project_version(ROOT)
    assert version.SEMVER.fullmatch(v), v
    chart = yaml.safe_load((ROOT / "charts/vnpu-operator/Chart.yaml").read_text())
    # Read back by Helm's own parser's view of the file, not only by the regexes.
    assert chart["version"] == chart["appVersion"] == v
    assert set(version.found(ROOT).values()) == {v}


def test_the_docs_name_the_current_image_tag() -> None:
    """Commands in the docs tag the image with the release's version; the CHANGELOG and
    UPGRADING name older versions on purpose."""
    v = version.project_version(ROOT)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    stale = []
    for doc in docs:
        if doc.name in ("UPGRADING.md", "DECISIONS.md"):
            continue
        for tag in re.findall(r"vnpu-operator:(\d+\.\d+\.\d+[0-9A-Za-z.-]*)", doc.read_text()):
            if tag.rstrip(".") != v and not tag.startswith(f"{v}-"):
                stale.append(f"{doc.relative_to(ROOT)}: vnpu-operator:{tag}")
    assert not stale, f"image tags other than {v}: {stale}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for place in version.PLACES:
        (tmp_path / place.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / place.path, tmp_path / place.path)
    return tmp_path


def test_a_place_left_behind_is_named(tree: Path) -> None:
    chart = tree / "charts/vnpu-operator/Chart.yaml"
    chart.write_text(chart.read_text().replace('appVersion: "', 'appVersion: "9', 1))
    (wrong,) = version.problems(tree)
    assert wrong.startswith("Chart.yaml appVersion is '9")


def test_set_moves_every_place_and_refuses_what_is_not_semver(tree: Path) -> None:
    version.set_version("1.4.0-rc.1", tree)
    assert version.project_version(tree) == "1.4.0-rc.1"
    assert set(version.found(tree).values()) == {"1.4.0-rc.1"}
    assert version.problems(tree) == []
    for bad in ("1.4", "v1.4.0", "01.4.0", "1.4.0+build.5"):
        with pytest.raises(version.VersionError, match="not a SemVer"):
            version.set_version(bad, tree)
    assert version.project_version(tree) == "1.4.0-rc.1"
