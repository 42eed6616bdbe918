"""Static checks of the Dockerfile against pyproject.toml and the chart (no Docker here),
and proof that `make image` builds the image from this same file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from image import build, dockerfile

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
CHART_TEMPLATES = ROOT / "charts" / "vnpu-operator" / "templates"
IMAGE_BUILDER = ROOT / "hack" / "image"
# The Python each Debian release ships as python3.X (the image takes Python from Debian).
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}


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


def _plan() -> dockerfile.Plan:
    return dockerfile.plan(DOCKERFILE.read_text())


def _python_version() -> str:
    """The Python the image uses: Debian's python3.X package (ARG PYTHON), which must be the
    one the FROM lines' Debian release ships."""
    plan = _plan()
    bases = {s.base_ref for s in plan.stages if s.base_ref}
    assert bases, "no stage starts from a Debian image"
    releases = set()
    for ref in bases:
        match = dockerfile.DEBIAN_REF.fullmatch(ref or "")
        assert match, f"every external base must be debian:<release>-slim, got {ref}"
        assert match.group("slim"), f"use the slim variant, got {ref}"
        releases.add(match.group("suite"))
    assert len(releases) == 1, f"stages use different Debian releases: {releases}"
    release = releases.pop()
    args = dict(
        (name, default)
        for ins in plan.global_args
        for name, default in dockerfile._arg_declarations(ins, {})
    )
    match = re.fullmatch(r"python(\d+\.\d+)", args.get("PYTHON") or "")
    assert match, f"ARG PYTHON must name Debian's python3.X package, got {args.get('PYTHON')}"
    assert DEBIAN_PYTHON.get(release) == match.group(1), (
        f"Debian {release} does not ship {args['PYTHON']}"
    )
    return match.group(1)


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


def test_make_image_runs_this_dockerfile() -> None:
    """`make image` is hack/image/build.sh, which runs image.build, whose recipe is this
    Dockerfile: users' `docker build` and the test image read the same file."""
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^image:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target, "no `image` target in the Makefile"
    assert "hack/image/build.sh" in target.group(1)
    assert "-m image.build" in (IMAGE_BUILDER / "build.sh").read_text()
    assert build.DEFAULT_DOCKERFILE == DOCKERFILE


def test_builder_holds_no_recipe_of_its_own() -> None:
    """What goes into the image is written only in the Dockerfile: the builder's files name
    none of its packages, install commands, paths or user (they would be a second recipe)."""
    recipe = ["pip install", "-m venv", "useradd", "groupadd", "/opt/vnpu", "python3.11", "10001"]
    text = DOCKERFILE.read_text()
    for word in recipe:
        assert word in text, f"the Dockerfile no longer has {word!r}: update this list"
    builder_files = sorted(p for p in IMAGE_BUILDER.iterdir() if p.suffix in (".py", ".sh"))
    assert builder_files
    for path in builder_files:
        for word in recipe:
            assert word not in path.read_text(), (
                f"{path.relative_to(ROOT)} mentions {word!r}: that belongs in the Dockerfile"
            )


def test_every_instruction_is_run_by_the_daemonless_build() -> None:
    """Each RUN and COPY of the Dockerfile is a step of the daemonless build, with the
    Dockerfile's own text, and the image config is what the instructions declare (read here
    by this file's own parser as a cross-check)."""
    plan = _plan()
    assert [s.index for s in plan.needed()] == [s.index for s in plan.stages]
    for stage in plan.stages:
        runs = [i.args for i in stage.instructions if i.keyword == "RUN"]
        assert [list(s.argv) for s in stage.steps if isinstance(s, dockerfile.Run)] == [
            ["/bin/sh", "-c", r] for r in runs
        ]
        copies = [i for i in stage.instructions if i.keyword == "COPY"]
        assert len([s for s in stage.steps if isinstance(s, dockerfile.Copy)]) == len(copies)
    config = plan.target.config.to_oci()
    instructions = _instructions()
    user = [rest for w, rest in instructions if w == "USER"][-1]
    (cmd,) = [rest for w, rest in instructions if w == "CMD"]
    assert config["User"] == user == "10001:10001"
    assert config["Cmd"] == [cmd.strip('[]"')]
    labels = config["Labels"]
    assert isinstance(labels, dict)
    assert labels["io.vnpu.entrypoints"] == "vnpu-operator vnpu-agent"
    env = config["Env"]
    assert isinstance(env, list)
    assert env[0].startswith("PATH=/opt/vnpu/bin:/usr/local/sbin:")
    assert set(config["ExposedPorts"]) == {"9100/tcp", "9101/tcp", "9443/tcp"}  # type: ignore[arg-type]


OCI_LABELS = {
    "title",
    "description",
    "version",
    "revision",
    "created",
    "source",
    "url",
    "documentation",
    "licenses",
    "vendor",
}


def test_oci_labels_are_complete_and_true() -> None:
    labels = _plan().target.config.labels
    oci = {k.removeprefix("org.opencontainers.image."): v for k, v in labels.items()}
    assert set(oci) >= OCI_LABELS, f"missing: {OCI_LABELS - set(oci)}"
    project = _pyproject()["project"]
    assert oci["version"] == project["version"], "ARG VERSION must follow pyproject.toml"
    assert oci["licenses"] == project["license"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert oci["source"].startswith("https://")
    # Unset unless the build names them: a test build never claims a commit or a time.
    assert oci["revision"] == oci["created"] == ""
    release = dockerfile.plan(
        DOCKERFILE.read_text(),
        {"REVISION": "0b51f13", "CREATED": "2026-11-01T00:00:00Z"},
    ).target.config.labels
    assert release["org.opencontainers.image.revision"] == "0b51f13"
    assert release["org.opencontainers.image.created"] == "2026-11-01T00:00:00Z"


def test_every_base_is_pinned_by_digest() -> None:
    for stage in _plan().stages:
        if stage.base_ref is None:
            continue
        match = dockerfile.DEBIAN_REF.fullmatch(stage.base_ref)
        assert match, stage.base_ref
        assert match.group("digest"), f"{stage.label()}: FROM {stage.base_ref} has no digest"


def test_python_packages_come_only_from_the_lock_files() -> None:
    """Every pip install in the image names a lock (by hash), or the project's own wheel
    with no resolution: nothing is chosen at build time."""
    runs = [rest for w, rest in _instructions() if w == "RUN"]
    installs = [
        part.strip()
        for run in runs
        for part in run.split("&&")
        if re.search(r"pip( --python \S+)? install", part)
    ]
    assert installs, "the Dockerfile installs nothing with pip"
    for command in installs:
        assert (
            "--require-hashes -r build-requirements.txt" in command
            or "-r pylock.toml" in command
            or ("--no-deps" in command and "--no-index" in command)
        ), f"installs outside the lock: {command}"
    assert any("-r pylock.toml" in c for c in installs)
    wheel = [part for run in runs for part in run.split("&&") if "pip wheel" in part]
    assert wheel
    assert all("--no-build-isolation" in w and "--no-deps" in w for w in wheel)
    copies = " ".join(rest for w, rest in _instructions() if w == "COPY")
    for name in ("pylock.toml", "build-requirements.txt", "LICENSE"):
        assert name in copies, f"the build context's {name} is not copied"
