"""The source roots: where `import vnpu_operator`, `import localplane` or `import bench`
finds its package. Defined once, as pyproject.toml's `[tool.pytest.ini_options]
pythonpath`; pytest reads it there, and everything else that needs the list reads it
through this module:

    python hack/localplane/sourceroots.py          the list, ':'-joined and relative
                                                   (the Makefile's PYPATH)
    python hack/localplane/sourceroots.py --check  fails when mypy_path, which mypy
                                                   reads and cannot take from pytest,
                                                   differs (`make lint`)
    source_roots(), pythonpath()                   the same, absolute, for the child
                                                   processes the plane starts

Standard library only, so that the Makefile can run it before anything is on the path.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = REPO_ROOT / "pyproject.toml"


def _tool(name: str) -> dict[str, Any]:
    with PYPROJECT.open("rb") as f:
        tool: dict[str, Any] = tomllib.load(f)["tool"][name]
    return tool


def root_names() -> list[str]:
    """The roots as pyproject.toml lists them, relative to the repository."""
    return [str(p) for p in _tool("pytest")["ini_options"]["pythonpath"]]


def source_roots() -> list[Path]:
    return [(REPO_ROOT / p).resolve() for p in root_names()]


def pythonpath() -> str:
    """PYTHONPATH for a child process: every root, absolute."""
    return os.pathsep.join(str(p) for p in source_roots())


def check() -> list[str]:
    """What mypy_path lacks or has beyond the roots (the repository root aside: mypy
    finds `bench` from the working directory, and a "." there would make every
    folder of the repository a candidate package)."""
    want = [p for p in root_names() if p != "."]
    have = [str(p) for p in _tool("mypy")["mypy_path"]]
    if have == want:
        return []
    return [f"pyproject.toml: [tool.mypy] mypy_path is {have}; the source roots say {want}"]


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        problems = check()
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    print(":".join(root_names()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
