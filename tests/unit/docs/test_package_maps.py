"""A newcomer finds each room from the tree itself (issue 57).

Two maps are checked:

- **Each Python package names its parts.** A package's map is its `__init__.py`
  docstring, together with a README.md in its directory where it has one (bench/,
  the vendored protos). It must exist and name every direct part: each module
  (`*.py` but `__init__.py` and `__main__.py`) and each subpackage, in backticks
  (`informer`, `informer.py`, `sim/`) or as a path (`placement/ledger.py`, `sim/`).
  A bare word does not count: "state" is prose, `state` is the module.
- **The root README's map names each top-level folder.** The first column of the
  table under "What is in here" holds every folder of the repository as a path in
  backticks (`hack/`, `operator/vnpu_operator/`), and no folder that is not there.

Every folder of the repository is walked but `tests/` (its files are named by their
test ids), hidden ones and those .gitignore ignores at the top. Under the vendored
protos (whose README.md is their map) the packages hold the kubelet's .proto files and
the modules generated from them, not ours to describe.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NOT_WALKED = {"tests"}
GENERATED_BELOW = ROOT / "node_agent" / "vnpu_agent" / "dra" / "protos"
ROOT_MAP_HEADING = "## What is in here"

_CODE_SPAN = re.compile(r"(`+)((?:(?!\1).)+?)\1")


def _ignored_at_top() -> list[str]:
    """The .gitignore patterns that can match a top-level folder's name."""
    patterns = []
    for line in (ROOT / ".gitignore").read_text().splitlines():
        pattern = line.strip().strip("/")
        if pattern and not pattern.startswith("#") and "/" not in pattern:
            patterns.append(pattern)
    return patterns


def top_level_folders(root: Path = ROOT) -> list[str]:
    ignored = _ignored_at_top()
    return sorted(
        entry.name
        for entry in root.iterdir()
        if entry.is_dir()
        and not entry.name.startswith(".")
        and not any(fnmatch.fnmatch(entry.name, pattern) for pattern in ignored)
    )


def packages() -> list[Path]:
    """Every directory with an `__init__.py` in the walked folders."""
    ignored = _ignored_at_top()
    found = []
    for name in top_level_folders():
        if name in NOT_WALKED:
            continue
        for init in sorted((ROOT / name).rglob("__init__.py")):
            package = init.parent
            parts = package.relative_to(ROOT).parts
            if any(
                part.startswith(".") or any(fnmatch.fnmatch(part, p) for p in ignored)
                for part in parts
            ):
                continue
            if GENERATED_BELOW in package.parents:
                continue
            found.append(package)
    return found


def package_parts(package: Path) -> list[str]:
    """The direct modules (by stem) and subpackages of a package."""
    modules = [
        path.stem
        for path in package.glob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    ]
    subpackages = [path.parent.name for path in package.glob("*/__init__.py")]
    return sorted(modules + subpackages)


def package_map(package: Path) -> str:
    """The `__init__.py` docstring and the directory's README.md, if any."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    readme = package / "README.md"
    return docstring + ("\n" + readme.read_text() if readme.is_file() else "")


def names_part(text: str, name: str) -> bool:
    """Does the map name this part: in backticks (`name`, `name.py`, `name/`, or a
    path ending with one of them), or as a path (`name.py`, `dir/name.py`, `name/`)?"""
    for _, span in _CODE_SPAN.findall(text):
        tail = span.strip().rstrip("/").rsplit("/", 1)[-1]
        if tail in (name, f"{name}.py"):
            return True
    return re.search(rf"(?<![\w.-])(?:[\w.-]+/)*{re.escape(name)}(?:\.py\b|/)", text) is not None


def unnamed_parts(package: Path) -> list[str]:
    text = package_map(package)
    return [part for part in package_parts(package) if not names_part(text, part)]


def root_map_folders(readme: str) -> set[str]:
    """The top-level folders the README's map names: the first part of each path in
    backticks in its table's first column (the second column's paths are inside them)."""
    lines = readme.splitlines()
    start = lines.index(ROOT_MAP_HEADING)
    first_cells = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            first_cells.append(line.split("|")[1])
    return {
        span.strip().split("/", 1)[0]
        for _, span in _CODE_SPAN.findall("\n".join(first_cells))
        if "/" in span
    }


@pytest.mark.parametrize("package", packages(), ids=lambda package: str(package.relative_to(ROOT)))
def test_package_names_its_parts(package: Path) -> None:
    where = package.relative_to(ROOT)
    assert package_map(package).strip(), (
        f"{where}/ has no map: give its __init__.py a docstring naming its parts"
    )
    missing = unnamed_parts(package)
    assert not missing, (
        f"{where}/__init__.py's docstring (or {where}/README.md) does not name "
        f"{', '.join(missing)}: one line each, in backticks or as a path"
    )


def test_root_map_names_every_top_level_folder() -> None:
    named = root_map_folders((ROOT / "README.md").read_text())
    folders = set(top_level_folders())
    assert not folders - named, (
        f"README.md's {ROOT_MAP_HEADING!r} does not name "
        f"{', '.join(f'{name}/' for name in sorted(folders - named))}"
    )
    assert not named - folders, (
        f"README.md's {ROOT_MAP_HEADING!r} names folders that are not there: "
        f"{', '.join(f'{name}/' for name in sorted(named - folders))}"
    )


def test_the_walk_finds_the_packages() -> None:
    found = {str(package.relative_to(ROOT)) for package in packages()}
    assert {
        "operator/vnpu_operator",
        "node_agent/vnpu_agent/drivers/sim",
        "node_agent/vnpu_agent/dra/protos",
        "hack/localplane",
        "bench/placement",
    } <= found
    assert not any(
        path.startswith(("tests/", "node_agent/vnpu_agent/dra/protos/")) for path in found
    )


# The checks above on crafted cases: each can fail.


def _package(root: Path, docstring: str, modules: list[str], subpackages: list[str]) -> Path:
    root.mkdir()
    (root / "__init__.py").write_text(f'"""{docstring}"""\n' if docstring else "")
    (root / "__main__.py").write_text("")
    for module in modules:
        (root / f"{module}.py").write_text("")
    for sub in subpackages:
        (root / sub).mkdir()
        (root / sub / "__init__.py").write_text("")
    return root


def test_a_part_left_out_or_named_as_prose_is_reported(tmp_path: Path) -> None:
    package = _package(
        tmp_path / "pkg",
        "The `engine` (one lock per call), state as prose, rules.py, the `sub/` package.",
        ["engine", "state", "rules", "other"],
        ["sub", "drivers"],
    )
    assert unnamed_parts(package) == ["drivers", "other", "state"]


def test_paths_and_backticks_name_parts(tmp_path: Path) -> None:
    package = _package(
        tmp_path / "pkg",
        "`a.py`, (b.py), `pkg/c.py`, placement/d.py, sub/, `drivers` and `x/y/`.",
        ["a", "b", "c", "d"],
        ["sub", "drivers", "y"],
    )
    assert unnamed_parts(package) == []


def test_a_readme_in_the_directory_counts_and_no_map_fails(tmp_path: Path) -> None:
    package = _package(tmp_path / "pkg", "", ["generate"], ["v1"])
    assert package_map(package).strip() == ""
    assert unnamed_parts(package) == ["generate", "v1"]
    (package / "README.md").write_text("`generate.py` makes the modules of `v1/`.\n")
    assert unnamed_parts(package) == []


def test_the_root_map_is_read_from_its_section_only() -> None:
    readme = (
        "# x\n\n## Documentation\n\n`docs/USAGE.md`\n\n"
        f"{ROOT_MAP_HEADING}\n\n| `common/vnpu_common/` | `api/models.py` |\n"
        "| `crds/`, `charts/` | y |\n"
        "| `make` | z |\n\n## Licence\n\n`LICENSE/`\n"
    )
    assert root_map_folders(readme) == {"common", "crds", "charts"}


def test_hidden_and_ignored_folders_are_not_top_level(tmp_path: Path) -> None:
    for name in ("bench", ".ci", "build", "x.egg-info", "__pycache__"):
        (tmp_path / name).mkdir()
    (tmp_path / "README.md").write_text("")
    assert top_level_folders(tmp_path) == ["bench"]
