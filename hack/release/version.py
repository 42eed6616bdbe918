"""The one version of a release and the places that must repeat it.

pyproject.toml's `[project] version` is where the version is defined. Helm, Docker and
Artifact Hub read their own files, so Chart.yaml (`version`, `appVersion`, the
`artifacthub.io/images` annotation) and the Dockerfile's `ARG VERSION` repeat it; `--check`
fails when one of them differs or the version is not SemVer, and `--set` moves them all:

    PYTHONPATH=hack python3 -m release.version --check
    PYTHONPATH=hack python3 -m release.version --set 0.3.0
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# semver.org's own regular expression (https://semver.org/#is-there-a-suggested-regular-
# expression-regex-to-check-a-semver-string), without the build metadata: Helm and OCI tags
# have no room for `+`.
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
)


@dataclass(frozen=True)
class Place:
    """One line of one file that carries the version: group 2 of `pattern` is the version."""

    name: str
    path: str
    pattern: re.Pattern[str]


_V = r"([0-9A-Za-z.+-]+)"
_CHART = "charts/vnpu-operator/Chart.yaml"
PLACES = (
    Place("pyproject.toml [project] version", "pyproject.toml",
          re.compile(rf'(?m)^(version = "){_V}(?=")')),
    Place("Chart.yaml version", _CHART, re.compile(rf"(?m)^(version: ){_V}$")),
    Place("Chart.yaml appVersion", _CHART, re.compile(rf'(?m)^(appVersion: "){_V}(?="$)')),
    Place("Chart.yaml artifacthub.io/images", _CHART,
          re.compile(rf"(?m)^(      image: vnpu-operator:){_V}$")),
    Place("Dockerfile ARG VERSION", "Dockerfile", re.compile(rf"(?m)^(ARG VERSION=){_V}$")),
)  # fmt: skip


class VersionError(Exception):
    pass


def project_version(root: Path = ROOT) -> str:
    """The release's version, from the one place it is defined."""
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def found(root: Path = ROOT) -> dict[str, str]:
    """Each place's version, as its file has it now."""
    out = {}
    for place in PLACES:
        text = (root / place.path).read_text()
        matches = place.pattern.findall(text)
        if len(matches) != 1:
            raise VersionError(f"{place.path}: {len(matches)} lines for {place.name}, not one")
        out[place.name] = matches[0][1]
    return out


def problems(root: Path = ROOT) -> list[str]:
    """What is wrong with the versions: empty when they agree and are SemVer."""
    version = project_version(root)
    out = []
    if not SEMVER.fullmatch(version):
        out.append(f"{version!r} (pyproject.toml) is not a SemVer version MAJOR.MINOR.PATCH[-PRE]")
    for name, value in found(root).items():
        if value != version:
            out.append(f"{name} is {value!r}, pyproject.toml says {version!r}")
    return out


def set_version(version: str, root: Path = ROOT) -> None:
    """Writes `version` into every place (pyproject.toml first)."""
    if not SEMVER.fullmatch(version):
        raise VersionError(f"{version!r} is not a SemVer version MAJOR.MINOR.PATCH[-PRE]")
    for place in PLACES:
        path = root / place.path
        text, n = place.pattern.subn(lambda m: m.group(1) + version, path.read_text())
        if n != 1:
            raise VersionError(f"{place.path}: {n} lines for {place.name}, not one")
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.version", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="fail unless every place agrees")
    group.add_argument("--set", metavar="VERSION", help="write VERSION into every place")
    args = parser.parse_args(argv)
    try:
        if args.set:
            set_version(args.set)
        wrong = problems()
    except VersionError as e:
        print(f"[version] error: {e}", file=sys.stderr)
        return 1
    for line in wrong:
        print(f"[version] {line}", file=sys.stderr)
    if not wrong:
        print(project_version())
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
