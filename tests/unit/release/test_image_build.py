"""The daemonless image builder's reading of a Dockerfile (hack/image/dockerfile.py):
Docker's meaning for what it implements, a refusal with the line for anything else, and
cache keys that change exactly when the image would."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from pathlib import Path

import pytest

from image import build, dockerfile
from image.dockerfile import DockerfileError, DockerIgnore

BASE = "FROM debian:bookworm-slim AS base\n"


def _target(text: str) -> dockerfile.Stage:
    return dockerfile.plan(text).target


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM python:3.11-slim\n", "only FROM debian"),
        (BASE + "ADD x /x\n", "does not implement ADD"),
        (BASE + "HEALTHCHECK CMD true\n", "does not implement HEALTHCHECK"),
        (BASE + 'SHELL ["/bin/bash", "-c"]\n', "does not implement SHELL"),
        (BASE + "RUN --mount=type=cache,target=/root/.cache true\n", "--mount"),
        (BASE + "COPY --chown=1:1 a /a\n", "--chown"),
        (BASE + "COPY *.py /src/\n", "wildcards"),
        (BASE + "RUN <<EOF\ntrue\nEOF\n", "here-documents"),
        (BASE + "COPY --from=nothing /a /a\n", "names no earlier stage"),
        ("RUN true\n", "only ARG may come before"),
    ],
)
def test_refuses_what_it_does_not_implement(text: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=message):
        dockerfile.plan(text)


def test_refusal_names_the_line() -> None:
    with pytest.raises(DockerfileError, match=r"Dockerfile line 3 \(ADD\)"):
        dockerfile.plan(BASE + "RUN true\nADD x /x\n")


def test_args_env_and_substitution_follow_docker() -> None:
    stage = _target(
        "ARG RELEASE=bookworm\n"
        "ARG PKG=python3.11\n"
        "FROM debian:${RELEASE}-slim\n"
        "ARG PKG\n"
        "ARG LOCAL=${PKG}-venv\n"
        "ENV A=1 B=$A-x\n"  # one ENV sees the values from before it
        "ENV C=${A}2 D='$A' E=\"$A\" F=${UNSET:-dflt} G=${A:+set}\n"
        "ENV LEGACY some value\n"
        "ENV PKG=overridden\n"
        "WORKDIR /a\n"
        "WORKDIR b\n"
        "RUN echo $PKG \\\n"
        "  # a comment inside a continuation is dropped\n"
        "  done\n"
    )
    env = stage.config.env
    assert env["PATH"] == dockerfile.DEBIAN_CONFIG_ENV["PATH"]  # inherited from the base
    assert env["B"] == "-x"
    assert env["C"] == "12"
    assert env["D"] == "$A"
    assert env["E"] == "1"
    assert env["F"] == "dflt"
    assert env["G"] == "set"
    assert env["LEGACY"] == "some value"
    assert "LOCAL" not in env  # ARGs never reach the image config
    assert stage.base_ref == "debian:bookworm-slim"
    assert stage.config.workdir == "/a/b"
    run = stage.steps[-1]
    assert isinstance(run, dockerfile.Run)
    assert run.argv == ("/bin/sh", "-c", "echo $PKG   done")
    run_env = dict(run.env)
    assert run_env["PKG"] == "overridden"  # ENV wins over ARG
    assert run_env["LOCAL"] == "python3.11-venv"  # ARG seen by RUN
    assert run.workdir == "/a/b"
    assert [s.path for s in stage.steps if isinstance(s, dockerfile.MakeDir)] == ["/a", "/a/b"]


def test_config_is_inherited_across_stages_and_entrypoint_resets_cmd() -> None:
    plan = dockerfile.plan(
        BASE + 'LABEL a="one two" b=2\nEXPOSE 80 53/udp\nUSER 5:6\n'
        'FROM base AS next\nENTRYPOINT ["tini", "--"]\n'
    )
    config = plan.target.config.to_oci()
    assert config["Labels"] == {"a": "one two", "b": "2"}
    assert config["ExposedPorts"] == {"80/tcp": {}, "53/udp": {}}
    assert config["User"] == "5:6"
    assert config["Entrypoint"] == ["tini", "--"]
    assert "Cmd" not in config  # the base's CMD ["bash"] is dropped by ENTRYPOINT
    assert plan.target.parent == 0
    assert dockerfile.plan(BASE).target.config.cmd == ["bash"]


def test_only_the_stages_the_target_needs_are_built() -> None:
    plan = dockerfile.plan(
        BASE
        + "FROM base AS unused\nRUN false\n"
        + "FROM base AS build\nRUN true\n"
        + "FROM base AS final\nCOPY --from=build /x /x\n"
    )
    assert [s.label() for s in plan.needed()] == ["base", "build", "final"]
    assert plan.parents() == {0}


def test_copy_destinations() -> None:
    stage = _target(BASE + "WORKDIR /src\nCOPY a b ./\nCOPY dir/ dir/\nCOPY f /abs/file\n")
    copies = [s for s in stage.steps if isinstance(s, dockerfile.Copy)]
    assert [(c.sources, c.dest, c.dest_is_dir) for c in copies] == [
        (("a", "b"), "/src", True),
        (("dir/",), "/src/dir", True),
        (("f",), "/abs/file", False),
    ]


def test_dockerignore_follows_docker() -> None:
    ignore = DockerIgnore("# comment\n**/__pycache__\n*.egg-info\nhack\n!hack/image\n/docs\n")
    assert ignore.excluded("common/pkg/__pycache__/m.pyc")
    assert ignore.excluded("__pycache__")
    assert ignore.excluded("x.egg-info/PKG-INFO")
    assert not ignore.excluded("common/x.egg-info")  # `*` does not cross directories
    assert ignore.excluded("hack/plane/build.sh")
    assert not ignore.excluded("hack/image/build.sh")  # re-included by the exception
    assert ignore.excluded("docs/README.md")
    assert not ignore.excluded("common/pkg/m.py")


def _context(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text("x = 1\n")
    (tmp_path / "src" / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    (tmp_path / "other.txt").write_text("not copied\n")
    (tmp_path / ".dockerignore").write_text("**/__pycache__\n")
    (tmp_path / "Dockerfile").write_text(
        BASE + "RUN apt-get update\nWORKDIR /w\nCOPY src/ src/\nRUN make\n"
    )
    return tmp_path


def _keys(context: Path) -> dockerfile.Keys:
    plan = dockerfile.plan((context / "Dockerfile").read_text())
    ignore = DockerIgnore((context / ".dockerignore").read_text())
    return dockerfile.stage_keys(plan, context, ignore, salt="builder")


def test_context_entries_skip_ignored_files(tmp_path: Path) -> None:
    context = _context(tmp_path)
    entries = dockerfile.context_entries(context, "src/", DockerIgnore("**/__pycache__\n"))
    assert [rel for rel, _ in entries] == ["pkg", "pkg/m.py"]
    with pytest.raises(DockerfileError, match="outside the build context"):
        dockerfile.context_entries(context, "../etc", DockerIgnore(""))
    with pytest.raises(DockerfileError, match="not in the build context"):
        dockerfile.context_entries(context, "src/pkg/__pycache__", DockerIgnore("**/__pycache__"))


def test_keys_change_exactly_when_the_image_would(tmp_path: Path) -> None:
    context = _context(tmp_path)
    first = _keys(context)
    # Ignored and uncopied files change nothing.
    (context / "src" / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"\1")
    (context / "other.txt").write_text("changed\n")
    assert _keys(context) == first
    # A copied source changes the final key, not the root before the first COPY.
    (context / "src" / "pkg" / "m.py").write_text("x = 2\n")
    changed = _keys(context)
    assert changed.final[0] != first.final[0]
    assert changed.before_copy == first.before_copy
    assert first.before_copy[0][0] == 2  # RUN apt-get update and WORKDIR come before it
    # So does a mode change (COPY keeps modes).
    (context / "src" / "pkg" / "m.py").chmod(0o755)
    assert _keys(context).final[0] != changed.final[0]
    # An instruction above the COPY changes both.
    dockerfile_path = context / "Dockerfile"
    dockerfile_path.write_text(dockerfile_path.read_text().replace("update", "update -q"))
    edited = _keys(context)
    assert edited.before_copy[0][1] != first.before_copy[0][1]


def test_resolve_in_root_stays_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "lib").symlink_to("/usr/lib")  # absolute: means the root's /usr/lib
    (root / "usr" / "lib" / "f").write_text("")
    assert build.resolve_in_root(root, "/lib/f") == root / "usr" / "lib" / "f"
    assert build.resolve_in_root(root, "/../../lib/f") == root / "usr" / "lib" / "f"
    # The last component is what COPY takes: a link stays a link.
    assert build.resolve_in_root(root, "/lib") == root / "lib"


def test_debian_base_is_slim_minbase_from_debian_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VNPU_DEBIAN_MIRROR", raising=False)
    monkeypatch.delenv("VNPU_DEBIAN_SECURITY_MIRROR", raising=False)
    argv = build.debian_argv("debian:bookworm-slim", Path("/r"))
    assert argv[:3] == ["mmdebstrap", "--mode=root", "--variant=minbase"]
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in argv
    assert argv[-4:] == [
        "/r",
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ]
    assert not any("path-exclude" in a for a in build.debian_argv("debian:bookworm", Path("/r")))


DIGEST = "ab" * 32


def test_build_args_replace_arg_defaults_as_docker_does() -> None:
    text = (
        "ARG BASE=debian:bookworm-slim\n"
        "ARG REVISION=\n"
        "FROM ${BASE}\n"
        "ARG REVISION\n"
        "ARG LOCAL=dflt\n"
        'LABEL rev="$REVISION" local="$LOCAL"\n'
    )
    plain = dockerfile.plan(text)
    assert plain.target.config.labels == {"rev": "", "local": "dflt"}
    given = dockerfile.plan(
        text, {"REVISION": "c0ffee", "LOCAL": "x", "BASE": f"debian:trixie-slim@sha256:{DIGEST}"}
    )
    assert given.target.config.labels == {"rev": "c0ffee", "local": "x"}
    assert given.target.base_ref == f"debian:trixie-slim@sha256:{DIGEST}"
    with pytest.raises(DockerfileError, match="--build-arg REVISON: the Dockerfile declares"):
        dockerfile.plan(text, {"REVISON": "typo"})


def test_build_args_are_part_of_the_cache_key(tmp_path: Path) -> None:
    """A release's labels differ from a test build's: never served from the other's cache."""
    (tmp_path / "Dockerfile").write_text(BASE + 'ARG REVISION=\nLABEL rev="$REVISION"\n')

    def key(args: dict[str, str] | None) -> str:
        plan = dockerfile.plan((tmp_path / "Dockerfile").read_text(), args)
        return dockerfile.stage_keys(plan, tmp_path, DockerIgnore(""), salt="s").final[0]

    assert key(None) == key({})
    assert key({"REVISION": "a"}) != key(None)
    assert key({"REVISION": "a"}) != key({"REVISION": "b"})


def test_build_arg_flag_parses_name_value() -> None:
    assert build.build_arg("CREATED=2026-11-01T00:00:00Z") == ("CREATED", "2026-11-01T00:00:00Z")
    assert build.build_arg("REVISION=") == ("REVISION", "")
    for bad in ("REVISION", "=x", "A B=c"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
            build.build_arg(bad)


def test_a_digest_pins_docker_and_keys_the_daemonless_base(tmp_path: Path) -> None:
    """FROM debian:<suite>-slim@sha256:...: mmdebstrap makes the same suite; a new digest
    is a fresh base, not the cached one."""
    pinned = f"debian:bookworm-slim@sha256:{DIGEST}"
    match = dockerfile.DEBIAN_REF.fullmatch(pinned)
    assert match
    assert (match["suite"], match["slim"], match["digest"]) == ("bookworm", "-slim", DIGEST)
    assert not dockerfile.DEBIAN_REF.fullmatch("debian:bookworm-slim@sha256:abc")
    assert build.debian_argv(pinned, Path("/r")) == build.debian_argv(
        "debian:bookworm-slim", Path("/r")
    )

    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')

    def base_snapshot(ref: str) -> Path:
        (tmp_path / "Dockerfile").write_text(f"FROM {ref}\nRUN true\n")
        builder = build.Builder(tmp_path, tmp_path / "Dockerfile", tmp_path / "cache")
        return builder.checkpoints(builder.plan.target)[0]

    first, other = base_snapshot(pinned), base_snapshot(f"debian:bookworm-slim@sha256:{'cd' * 32}")
    assert first != other
    assert first.name.startswith("from-debian-bookworm-slim-")
    assert "sha256" not in first.name


def test_created_follows_source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1790467200")
    assert build.created().isoformat() == "2026-09-27T00:00:00+00:00"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(build.BuildError, match="SOURCE_DATE_EPOCH"):
        build.created()
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert abs(build.created().timestamp() - time.time()) < 5


def _pyproject(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    (tmp_path / "Dockerfile").write_text(BASE + "RUN true\n")
    return tmp_path


def test_platform_flag_names_the_two_platforms() -> None:
    assert build.platform_arg("linux/arm64") is build.PLATFORMS["linux/arm64"]
    assert build.platform_arg("linux/arm64/v8") is build.PLATFORMS["linux/arm64"]
    assert build.platform_arg("linux/amd64").oci == {"architecture": "amd64", "os": "linux"}
    assert build.PLATFORMS["linux/arm64"].oci == {
        "architecture": "arm64",
        "os": "linux",
        "variant": "v8",
    }
    for bad in ("linux/386", "arm64", "windows/amd64"):
        with pytest.raises(argparse.ArgumentTypeError, match="unsupported platform"):
            build.platform_arg(bad)


def test_platform_keys_the_cache_and_names_the_archive(tmp_path: Path) -> None:
    """An arm64 build never reuses an amd64 stage or archive; the amd64 archive keeps the
    name the real-node lane reads, the arm64 one says arm64."""
    context = _pyproject(tmp_path)
    cache = tmp_path / "cache"

    def builder(name: str) -> build.Builder:
        return build.Builder(context, context / "Dockerfile", cache, platform=build.PLATFORMS[name])

    amd64, arm64 = builder("linux/amd64"), builder("linux/arm64")
    assert amd64.keys.final != arm64.keys.final
    assert amd64.tag != arm64.tag
    assert amd64.archive.name == f"vnpu-operator-{amd64.tag}.oci.tar"
    assert arm64.archive.name == f"vnpu-operator-{arm64.tag}-arm64.oci.tar"
    base_amd64 = amd64.checkpoints(amd64.plan.target)[0]
    base_arm64 = arm64.checkpoints(arm64.plan.target)[0]
    assert base_amd64 != base_arm64
    assert base_arm64.name.startswith("from-debian-bookworm-slim-arm64-")


def test_a_foreign_base_is_made_for_its_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "host_platform", lambda: build.PLATFORMS["linux/amd64"])
    arm64 = build.debian_argv("debian:bookworm-slim", Path("/r"), build.PLATFORMS["linux/arm64"])
    assert "--architectures=arm64" in arm64
    native = build.debian_argv("debian:bookworm-slim", Path("/r"), build.PLATFORMS["linux/amd64"])
    # The host's base keeps the command it always had, and so its cached snapshot.
    assert native == build.debian_argv("debian:bookworm-slim", Path("/r"))
    assert not any(a.startswith("--architectures") for a in native)


def test_elf_machine_reads_the_header(tmp_path: Path) -> None:
    def elf(machine: int) -> Path:
        path = tmp_path / f"elf-{machine:x}"
        header = b"\x7fELF\x02\x01\x01" + bytes(9) + (2).to_bytes(2, "little")
        path.write_bytes(header + machine.to_bytes(2, "little") + bytes(44))
        return path

    assert build.elf_machine(elf(0xB7)) == "aarch64"
    assert build.elf_machine(elf(0x3E)) == "x86_64"
    assert build.elf_machine(elf(0x28)) == "e_machine 0x28"
    (tmp_path / "script").write_text("#!/bin/sh\n")
    with pytest.raises(build.BuildError, match="not an ELF file"):
        build.elf_machine(tmp_path / "script")
    # The host's own interpreter: the reader agrees with uname.
    assert build.elf_machine(Path(sys.executable).resolve()) == os.uname().machine


def test_follow_in_root_follows_the_last_link_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "python3.11").write_text("")
    (root / "usr" / "bin" / "python3").symlink_to("python3.11")
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python").symlink_to("/usr/bin/python3")  # absolute: in root
    assert build.follow_in_root(root, "/venv/bin/python") == root / "usr" / "bin" / "python3.11"


def test_executable_in_root_finds_what_a_console_script_runs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "python3.11").write_bytes(b"\x7fELF")
    (root / "env" / "bin").mkdir(parents=True)
    (root / "env" / "bin" / "python").symlink_to("/usr/bin/python3.11")
    (root / "env" / "bin" / "tool").write_text("#!/env/bin/python\nimport tool\n")
    path = "/env/bin:/usr/bin"
    assert build.executable_in_root(root, "tool", path) == root / "usr" / "bin" / "python3.11"
    assert build.executable_in_root(root, "python3.11", path) == root / "usr/bin/python3.11"
    with pytest.raises(build.BuildError, match="not in the image's PATH"):
        build.executable_in_root(root, "missing", path)


def _fake_elf(path: Path, machine: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + (2).to_bytes(2, "little")
    path.write_bytes(header + machine.to_bytes(2, "little") + bytes(44))
    path.chmod(0o755)


def _packed(
    tmp_path: Path, platform: str, machine: int, sh_machine: int = 0xB7
) -> tuple[build.Builder, Path]:
    """A tiny image packed for `platform` whose python and sh are ELF headers for the
    given machines."""
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    (tmp_path / "Dockerfile").write_text(
        BASE + 'ENV PATH=/env/bin:/usr/bin\nLABEL io.vnpu.entrypoints="tool"\n'
        'USER 10001:10001\nCMD ["tool"]\n'
    )
    builder = build.Builder(
        tmp_path, tmp_path / "Dockerfile", tmp_path / "cache", platform=build.PLATFORMS[platform]
    )
    root = tmp_path / "root"
    _fake_elf(root / "usr" / "bin" / "python3", machine)
    _fake_elf(root / "usr" / "bin" / "dash", sh_machine)
    (root / "bin").symlink_to("usr/bin")
    (root / "usr" / "bin" / "sh").symlink_to("dash")
    (root / "env" / "bin").mkdir(parents=True)
    (root / "env" / "bin" / "tool").write_text("#!/usr/bin/python3\n")
    builder.work = tmp_path / "work"
    builder.work.mkdir()
    archive = tmp_path / "image.oci.tar"
    builder.pack(root, archive)
    return builder, archive


def test_an_arm64_archive_says_arm64_and_the_check_reads_it(tmp_path: Path) -> None:
    builder, archive = _packed(tmp_path, "linux/arm64", 0xB7)
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        (desc,) = index["manifests"]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{desc['digest'][7:]}"))  # type: ignore[arg-type]
        config = json.load(
            tar.extractfile(f"blobs/sha256/{manifest['config']['digest'][7:]}")  # type: ignore[arg-type]
        )
    assert desc["platform"] == {"architecture": "arm64", "os": "linux", "variant": "v8"}
    assert (config["architecture"], config["os"], config["variant"]) == ("arm64", "linux", "v8")
    # The same archive checked as amd64 is refused before anything runs.
    with pytest.raises(build.BuildError, match="platform is"):
        build.verify(
            archive,
            builder.ref,
            builder.plan.target.config,
            tmp_path / "verify",
            build.PLATFORMS["linux/amd64"],
        )


def test_the_check_refuses_host_binaries_in_a_foreign_image(tmp_path: Path) -> None:
    """An arm64 image whose interpreter is x86_64 (a build that ran the host's binaries)
    fails on the ELF header, before any entrypoint would start, even when its sh is right."""
    builder, archive = _packed(tmp_path, "linux/arm64", 0x3E)
    with pytest.raises(build.BuildError, match="tool runs usr/bin/python3, an x86_64 binary"):
        build.verify(
            archive,
            builder.ref,
            builder.plan.target.config,
            tmp_path / "verify",
            build.PLATFORMS["linux/arm64"],
        )


def test_emulation_needs_an_enabled_fix_binary_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "BINFMT", tmp_path)
    arm64 = build.PLATFORMS["linux/arm64"]
    with pytest.raises(build.BuildError, match="no binfmt_misc entry"):
        build.check_emulation(arm64)
    entry = tmp_path / "qemu-aarch64"
    fields = "interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: {}\noffset 0\n"
    entry.write_text("enabled\n" + fields.format("P"))
    with pytest.raises(build.BuildError, match="F \\(fix-binary\\)"):
        build.check_emulation(arm64)
    entry.write_text("disabled\n" + fields.format("PF"))
    with pytest.raises(build.BuildError, match="must be enabled"):
        build.check_emulation(arm64)
    entry.write_text("enabled\n" + fields.format("PF"))
    build.check_emulation(arm64)  # what qemu-user-static's binfmt-support entry gives


def test_a_build_prunes_only_its_own_platform(tmp_path: Path) -> None:
    """A release builds amd64 then arm64: neither may delete the other's archive or roots."""
    context = _pyproject(tmp_path)
    cache = tmp_path / "cache"
    amd64, arm64 = (
        build.Builder(context, context / "Dockerfile", cache, platform=build.PLATFORMS[name])
        for name in ("linux/amd64", "linux/arm64")
    )
    assert amd64.snapshots != arm64.snapshots
    kept: list[Path] = []
    for builder in (amd64, arm64):
        for path in [builder.archive, *builder.checkpoints(builder.plan.target).values()]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
            kept.append(path)
    old_arm64 = [cache / f"vnpu-operator-1.0-{n:012x}-arm64.oci.tar" for n in range(3)]
    for n, path in enumerate(old_arm64):
        path.write_bytes(b"")
        os.utime(path, (n + 1, n + 1))  # older than the current one
    os.utime(amd64.archive, (0, 0))  # the oldest of all: only arm64's count for arm64
    stale_root = arm64.snapshots / "build-0123456789abcdef.tar"
    stale_root.write_bytes(b"")
    arm64.prune()
    assert all(path.exists() for path in kept)
    assert [p.exists() for p in old_arm64] == [False, True, True]  # three arm64 kept
    assert not stale_root.exists()
    assert build.archive_platform(arm64.archive.name) is build.PLATFORMS["linux/arm64"]
    assert build.archive_platform(amd64.archive.name) is build.PLATFORMS["linux/amd64"]
