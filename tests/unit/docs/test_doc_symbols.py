"""Every code name the documents give exists in the code.

Two kinds of reference are checked, in inline code outside fenced blocks:

- a dotted name that starts with one of the project's packages
  (`vnpu_agent.serving.AllocationServer`, `vnpu_common.process.settings.ComponentSettings`,
  `bench.placement`): the longest importable module prefix is imported and the
  rest looked up attribute by attribute;
- `Class.attribute` where a class of the project's packages has that name
  (`Ledger.place`, `Controller.listed`): that class, or a project class it
  derives from, must define the attribute (a method, a field, a constant);
  a class that also derives from a class outside the project is given the
  benefit of the doubt;
- a path to a Python file (`placement/ledger.py`, `hack/localplane/realnode.py`):
  some file of the repository must end with it.

A failure names the document, the line and what is missing, so a rename that
leaves a doc behind is caught where it is read.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = sorted(
    {
        *(ROOT / name for name in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md")),
        ROOT / "hack" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    }
)
PACKAGES = ("vnpu_operator", "vnpu_agent", "vnpu_common", "vnpu_cli", "localplane", "bench")

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)((?:(?!\1).)+?)\1")
_PACKAGE = "|".join(PACKAGES)
_DOTTED = re.compile(rf"(?<![\w./-])(?:{_PACKAGE})(?:\.[A-Za-z_]\w*)+(?![\w./-])")
# `Ledger.place`, `Controller.listed`: a project class and one of its attributes.
_CLASS_ATTR = re.compile(
    r"(?<![\w./-])([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)\.([A-Za-z_]\w*)(?![\w./-])"
)
_PY_PATH = re.compile(r"(?<![\w.-])(?:[\w.-]+/)+[\w-]+\.py\b|(?<![\w./-])[\w-]+/[\w-]+\.py\b")


def code_spans(text: str) -> Iterator[tuple[int, str]]:
    """(line number, content) of each inline code span outside fenced blocks."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = _FENCE.match(line.strip())
        if opened:
            if fence is None:
                fence = opened.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            for match in _INLINE_CODE.finditer(line):
                yield number, match.group(2)


def missing_symbol(dotted: str) -> str | None:
    """Why `dotted` names nothing, or None when it resolves."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and not module_name.startswith(error.name):
                return f"importing {module_name} fails: {error}"
            continue
        for i, attr in enumerate(parts[cut:], start=cut):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:i])} has no {attr}"
            obj = getattr(obj, attr)
        return None
    return f"no module {parts[0]}"


@cache
def _python_files() -> tuple[str, ...]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple("/" + path for path in listed.split())


def missing_path(path: str) -> str | None:
    suffix = "/" + path.removeprefix("./")
    if any(name.endswith(suffix) for name in _python_files()):
        return None
    first = suffix.split("/")[1]
    if not any(f"/{first}/" in name for name in _python_files()):
        return None  # another project's file (`kopf/_kits/webhooks.py`)
    return f"no file ends with {path}"


@cache
def _classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Each class name of the project's packages -> (attributes, base names) per
    definition, read with ast (importing every module would run their side effects)."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for name in _python_files():
        parts = name.strip("/").split("/")
        if not any(package in parts for package in PACKAGES) or "tests" in parts[:1]:
            continue
        tree = ast.parse((ROOT / name.strip("/")).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            attrs: set[str] = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    attrs.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    attrs.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    attrs.update(t.id for t in item.targets if isinstance(t, ast.Name))
            for sub in ast.walk(node):  # self.x = ... in any method
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    attrs.add(sub.attr)
            bases = [ast.unparse(base).split(".")[-1] for base in node.bases]
            found.setdefault(node.name, []).append((attrs, bases))
    return found


def _has_attribute(cls: str, attr: str, seen: frozenset[str] = frozenset()) -> bool | None:
    """True or False for a project class; None where a base lies outside the project."""
    definitions = _classes().get(cls)
    if definitions is None:
        return None if cls not in ("object", "Protocol", "Generic") else False
    unknown = False
    for attrs, bases in definitions:
        if attr in attrs:
            return True
        for base in bases:
            if base in seen:
                continue
            answer = _has_attribute(base, attr, seen | {cls})
            if answer:
                return True
            unknown = unknown or answer is None
    return None if unknown else False


def missing_attribute(cls: str, attr: str) -> str | None:
    if cls not in _classes() or _has_attribute(cls, attr) is not False:
        return None
    return f"no class {cls} of the project has {attr}"


def problems(path: Path) -> list[str]:
    found = []
    where = path.relative_to(ROOT)
    for number, span in code_spans(path.read_text()):
        for dotted in _DOTTED.findall(span):
            why = missing_symbol(dotted)
            if why:
                found.append(f"{where}:{number}: `{dotted}`: {why}")
        for cls, attr in _CLASS_ATTR.findall(span):
            why = missing_attribute(cls, attr)
            if why:
                found.append(f"{where}:{number}: `{cls}.{attr}`: {why}")
        for file in _PY_PATH.findall(span):
            why = missing_path(file)
            if why:
                found.append(f"{where}:{number}: `{file}`: {why}")
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_names_in_docs_exist(path: Path) -> None:
    assert problems(path) == []


def test_the_checker_catches_what_is_gone(tmp_path: Path) -> None:
    # The checker itself, on a document inside the repository's tree shape.
    doc = ROOT / "docs" / "_symbols_check_tmp.md"
    doc.write_text(
        "`vnpu_common.wire.names.REASON_WAITING` and `vnpu_agent.serving.AllocationServer` exist;\n"
        "`vnpu_common.wire.names.NO_SUCH_NAME`, `vnpu_operator.no_such_module.X`,\n"
        "`placement/ledger.py` and `placement/no_such_file.py`, `kopf/_kits/webhooks.py`;\n"
        "`Ledger.place`, `Ledger.no_such_method`, `NotOurs.anything`;\n"
        "```\n`vnpu_common.fenced.NotChecked`\n```\n"
        "`python -m bench.placement --help`, `vnpu_operator_pods_waiting{reason}`\n"
    )
    try:
        found = problems(doc)
    finally:
        doc.unlink()
    assert found == [
        "docs/_symbols_check_tmp.md:2: `vnpu_common.wire.names.NO_SUCH_NAME`: "
        "vnpu_common.wire.names has no NO_SUCH_NAME",
        "docs/_symbols_check_tmp.md:2: `vnpu_operator.no_such_module.X`: "
        "vnpu_operator has no no_such_module",
        "docs/_symbols_check_tmp.md:3: `placement/no_such_file.py`: "
        "no file ends with placement/no_such_file.py",
        "docs/_symbols_check_tmp.md:4: `Ledger.no_such_method`: "
        "no class Ledger of the project has no_such_method",
    ]
