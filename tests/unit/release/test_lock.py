"""The lock files (`make lock`, hack/lock.sh): complete, consistent with pyproject.toml's
floors and with each other, hashed, and installable on arm64 (Kunpeng) as on amd64, read
offline from the files' own metadata (pylock.toml names every file with its hash)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging import tags
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "pylock.toml"
DEV = ROOT / "pylock.dev.toml"
BUILD = ROOT / "build-requirements.txt"
# The image's Python and libc: Debian bookworm ships CPython 3.11 and glibc 2.36.
PYTHON = (3, 11)
GLIBC = (2, 36)


def _lock(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def _pyproject() -> dict[str, Any]:
    return _lock(ROOT / "pyproject.toml")


def _versions(lock: dict[str, Any]) -> dict[str, str]:
    return {canonicalize_name(p["name"]): p["version"] for p in lock["packages"]}


def _files(package: dict[str, Any]) -> list[dict[str, Any]]:
    return [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]


def _environment(machine: str) -> dict[str, str]:
    """PEP 508 marker values of the image on a Linux host of this machine."""
    return {
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_machine": machine,
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "python_version": f"{PYTHON[0]}.{PYTHON[1]}",
        "python_full_version": f"{PYTHON[0]}.{PYTHON[1]}.2",
    }


def _linux_tags(machine: str) -> set[tags.Tag]:
    """Every wheel tag CPython 3.11 on a glibc 2.36 Linux of this machine installs:
    manylinux down to glibc 2.5 (PEP 600) and the older names of 2.17, 2.12 and 2.5
    (PEP 599, 571, 513), as pip accepts them (py-spy ships manylinux1 for x86_64)."""
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC[1], 4, -1)]
    platforms += [f"manylinux{old}_{machine}" for old in ("2014", "2010", "1")]
    return {
        *tags.cpython_tags(PYTHON, abis=["cp311", "abi3", "none"], platforms=platforms),
        *tags.compatible_tags(PYTHON, "cp311", platforms),
    }


def missing_wheels(lock: dict[str, Any], machine: str) -> list[str]:
    """name==version of each package the machine needs and no locked wheel serves (pip
    would build it from source there, or fail)."""
    supported = _linux_tags(machine)
    env = _environment(machine)
    missing = []
    for package in lock["packages"]:
        marker = package.get("marker")
        if marker and not Marker(marker).evaluate(env):
            continue
        wheel_tags = set()
        for wheel in package.get("wheels", []):
            name = wheel.get("name") or wheel["url"].rsplit("/", 1)[-1]
            wheel_tags |= parse_wheel_filename(name)[3]
        if not wheel_tags & supported:
            missing.append(f"{package['name']}=={package['version']}")
    return missing


@pytest.mark.parametrize("lock_file", [RUNTIME, DEV], ids=["pylock.toml", "pylock.dev.toml"])
@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_every_locked_package_has_a_wheel_for_the_image(lock_file: Path, machine: str) -> None:
    """arm64 (Kunpeng) as amd64: a manylinux wheel of that machine or a pure-Python one."""
    lock = _lock(lock_file)
    assert len(lock["packages"]) >= 20
    assert missing_wheels(lock, machine) == []


def test_the_wheel_check_can_fail() -> None:
    """An x86_64-only package is caught for arm64; its marker can rule it out."""
    url = "https://files.example/pkg/fast-1.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    lock = {"packages": [{"name": "fast", "version": "1.0", "wheels": [{"url": url}]}]}
    assert missing_wheels(lock, "aarch64") == ["fast==1.0"]
    assert missing_wheels(lock, "x86_64") == []
    lock["packages"][0]["marker"] = "platform_machine == 'x86_64'"
    assert missing_wheels(lock, "aarch64") == []
    # A newer glibc than Debian's is no use either.
    newer = url.replace("manylinux_2_17_x86_64", "manylinux_2_39_aarch64")
    lock = {"packages": [{"name": "fast", "version": "1.0", "wheels": [{"url": newer}]}]}
    assert missing_wheels(lock, "aarch64") == ["fast==1.0"]


@pytest.mark.parametrize("lock_file", [RUNTIME, DEV], ids=["pylock.toml", "pylock.dev.toml"])
def test_every_file_is_pinned_by_sha256(lock_file: Path) -> None:
    lock = _lock(lock_file)
    assert lock["lock-version"] == "1.0"
    for package in lock["packages"]:
        files = _files(package)
        assert files, f"{package['name']}: no file locked"
        for entry in files:
            assert re.fullmatch(r"[0-9a-f]{64}", entry["hashes"]["sha256"]), package["name"]


def test_runtime_lock_is_the_tested_set_without_the_dev_tools() -> None:
    """The image holds no version, nor any file, that `make test` did not install."""
    runtime, dev = _lock(RUNTIME), _lock(DEV)
    dev_by_name = {canonicalize_name(p["name"]): p for p in dev["packages"]}
    for package in runtime["packages"]:
        name = canonicalize_name(package["name"])
        assert name in dev_by_name, f"{name} is in pylock.toml only"
        assert package["version"] == dev_by_name[name]["version"], name
        assert package == dev_by_name[name], f"{name}: files or markers differ"
    dev_only = set(dev_by_name) - set(_versions(runtime))
    tools = {canonicalize_name(Requirement(r).name) for r in _dev_requirements()}
    assert dev_only >= tools - set(_versions(runtime))
    assert {"pytest", "mypy", "ruff", "uv"} <= dev_only


def _dev_requirements() -> list[str]:
    return list(_pyproject()["project"]["optional-dependencies"]["dev"])


@pytest.mark.parametrize(
    ("lock_file", "which"),
    [(RUNTIME, "dependencies"), (DEV, "dependencies"), (DEV, "dev")],
)
def test_pins_satisfy_the_floors_in_pyproject(lock_file: Path, which: str) -> None:
    """pyproject.toml keeps ranges; each locked version lies in its range (run `make lock`
    after editing pyproject.toml)."""
    project = _pyproject()["project"]
    wanted = project["dependencies"] if which == "dependencies" else _dev_requirements()
    versions = _versions(_lock(lock_file))
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in versions, f"{name} is not in {lock_file.name}: run `make lock`"
        assert requirement.specifier.contains(versions[name], prereleases=True), (
            f"{lock_file.name} pins {name}=={versions[name]}, outside {requirement.specifier}"
        )


def _build_pins() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256s) of build-requirements.txt."""
    text = BUILD.read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert match, f"build-requirements.txt: not a hashed pin: {line!r}"
        hashes = re.findall(r"[0-9a-f]{64}", match.group(3))
        pins[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return pins


def test_build_requirements_pin_pip_and_the_build_backend_by_hash() -> None:
    pins = _build_pins()
    requires = [*_pyproject()["build-system"]["requires"], "pip>=26.3"]
    for text in requires:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in build-requirements.txt: run `make lock`"
        assert requirement.specifier.contains(pins[name][0]), (name, pins[name][0])
    # What installs the tested set and the image's is one and the same pip.
    dev = _versions(_lock(DEV))
    for name, (version, _) in pins.items():
        if name in dev:
            assert dev[name] == version, f"{name}: build {version}, tested {dev[name]}"


def test_make_venv_installs_exactly_the_lock() -> None:
    """`make venv` (so `make test`): no resolution of its own, only the locked files."""
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^\$\(STAMP\):(.*)\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert rule, "no $(STAMP) rule in the Makefile"
    prerequisites, recipe = rule.group(1), rule.group(2)
    for name in ("pyproject.toml", DEV.name, BUILD.name):
        assert name in prerequisites, f"a new {name} must reinstall .venv"
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert installs == [
        "\t$(PY) -m pip install -q --require-hashes -r build-requirements.txt",
        "\t$(PY) -m pip install -q -r pylock.dev.toml",
        "\t$(PY) -m pip install -q --no-deps --no-build-isolation -e .",
    ]
    lock_rule = re.search(r"^lock:.*\n\t(.*)\n", makefile, re.MULTILINE)
    assert lock_rule
    assert "hack/lock.sh" in lock_rule.group(1)
