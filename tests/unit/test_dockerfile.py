"""Static checks of the Dockerfile against pyproject.toml and the chart (no Docker here)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CHART_TEMPLATES = ROOT / "charts" / "vnpu-operator" / "templates"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _scripts() -> set[str]:
    return set(_pyproject()["project"]["scripts"])


def _python_version() -> str:
    """The Python the image uses: the FROM tags, with ARG defaults substituted."""
    args = {}
    versions = set()
    for word, rest in _instructions():
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
        if word == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            match = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?-slim(?:-\w+)?", image)
            assert match, f"every stage must be a slim python image, got {image}"
            versions.add(match.group(1))
    assert len(versions) == 1, f"stages use different Pythons: {versions}"
    return versions.pop()


def test_python_version_matches_requires_python() -> None:
    requires = _pyproject()["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+\.\d+)", requires)
    assert match, f"unexpected requires-python {requires!r}"
    assert _python_version() == match.group(1)


def test_multi_stage_and_non_root() -> None:
    instructions = _instructions()
    assert sum(1 for w, _ in instructions if w == "FROM") >= 2
    users = [rest for w, rest in instructions if w == "USER"]
    assert users, "the image must not run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "USER must be numeric, so that runAsNonRoot can check it"
    assert int(uid) != 0, "USER must not be root"


def test_entrypoints_exist_in_project_scripts() -> None:
    scripts = _scripts()
    instructions = _instructions()
    (label,) = [rest for w, rest in instructions if w == "LABEL" and "io.vnpu.entrypoints" in rest]
    named = re.search(r'io\.vnpu\.entrypoints="([^"]+)"', label)
    assert named
    entrypoints = set(named.group(1).split())
    assert entrypoints == {"vnpu-operator", "vnpu-agent"}
    assert entrypoints <= scripts, f"not in [project.scripts]: {entrypoints - scripts}"
    # The default command and the commands the build stage runs are entrypoints too.
    (cmd,) = [rest for w, rest in instructions if w == "CMD"]
    assert cmd.strip('[]"') in scripts
    runs = " ".join(rest for w, rest in instructions if w == "RUN")
    for name in entrypoints:
        assert f"{name} --help" in runs, f"the build does not check that {name} starts"


def test_chart_commands_are_project_scripts() -> None:
    scripts = _scripts()
    commands = set()
    for template in CHART_TEMPLATES.glob("*.yaml"):
        commands |= set(re.findall(r"command: \[([\w-]+)\]", template.read_text()))
    assert commands == {"vnpu-operator", "vnpu-agent"}
    assert commands <= scripts
