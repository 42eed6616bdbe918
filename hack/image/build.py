"""Builds the product image without Docker, from `Dockerfile` itself, and verifies it.

The stages the last one needs run in order, each in its own root filesystem: `FROM
debian:<suite>[-slim]` is made from Debian's packages by mmdebstrap, `FROM <stage>` copies
that stage's root, RUN runs in a chroot (image.chroot), COPY takes the build context
through .dockerignore. The last stage's root becomes one gzip layer of an OCI image layout
archive named by the `io.containerd.image.name` annotation, with the config the Dockerfile
declares. Before the archive enters the cache, verify() unpacks it into a fresh root and
starts every entrypoint there with `--help`, as the image's user, on a read-only root.

Driven by hack/image/build.sh (which installs mmdebstrap and takes the cache lock):

    python3 -m image.build [--print] [--no-cache] [--platform linux/arm64]
                                                      (PYTHONPATH=hack; root to build)

A foreign platform (linux/arm64 on an amd64 host, or the reverse) is built the same way:
mmdebstrap makes that architecture's base, and every RUN and the final check run its
binaries through qemu-user, registered by build.sh with binfmt_misc's fix-binary flag.
"""

from __future__ import annotations

import argparse
import configparser
import datetime as dt
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from image import dockerfile as df

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_DOCKERFILE = ROOT / "Dockerfile"
# `vnpu-operator:<tag>` as Kubernetes and containerd's CRI normalize it: an image imported
# under the short name would not be found when a pod names `vnpu-operator:<tag>`.
REPOSITORY = "docker.io/library/vnpu-operator"
KEEP_ARCHIVES = 3
LAYOUT_NAME = re.compile(r"oci-layout|index\.json|blobs(?:/sha256(?:/[0-9a-f]{64})?)?")

# debian:<suite>-slim on Docker Hub is minbase with these dpkg path excludes (debuerreotype's
# --slim); the merged-usr hook gives the /usr symlinks without the usrmerge package (which
# would pull in perl).
SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/merged-usr")

# Build-time only, never in the image config: what the host needs to reach the package
# registries (Docker passes the proxy variables to RUN the same way).
PASSTHROUGH_ENV = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_DEFAULT_TIMEOUT",
)
BUILD_CA_PATH = "/etc/vnpu-build-ca.pem"


class BuildError(Exception):
    pass


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    if os.environ.get("VNPU_IMAGE_CACHE"):
        return Path(os.environ["VNPU_IMAGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vnpu-operator" / "images"


def project_version(context: Path) -> str:
    return str(tomllib.loads((context / "pyproject.toml").read_text())["project"]["version"])


def builder_salt() -> str:
    """The builder's own files: a change to how images are made rebuilds them."""
    h = hashlib.sha256()
    for path in df.iter_files([HERE]):
        h.update(f"{path.name}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Platform:
    """An OCI platform the image is built for, with the names each tool gives it."""

    name: str  # linux/<arch>, as docker buildx --platform
    architecture: str  # OCI / Go GOARCH, and Debian's architecture name for these two
    variant: str | None  # the OCI platform variant (arm64's is v8)
    machine: str  # uname -m, and the ELF machine the image's binaries are for
    qemu: str  # qemu-user's name for it (qemu-<qemu>-static, binfmt entry qemu-<qemu>)

    @property
    def oci(self) -> dict[str, str]:
        """The platform object of an index's manifest descriptor."""
        out = {"architecture": self.architecture, "os": "linux"}
        if self.variant:
            out["variant"] = self.variant
        return out


PLATFORMS = {
    p.name: p
    for p in (
        Platform("linux/amd64", "amd64", None, "x86_64", "x86_64"),
        Platform("linux/arm64", "arm64", "v8", "aarch64", "aarch64"),
    )
}


def host_platform() -> Platform:
    machine = os.uname().machine
    for platform in PLATFORMS.values():
        if platform.machine == machine:
            return platform
    raise BuildError(f"unsupported machine {machine} (amd64 and arm64 are)")


def platform_arg(text: str) -> Platform:
    """`--platform`: linux/amd64 or linux/arm64 (linux/arm64/v8 too, as Docker accepts)."""
    name = text.strip().lower()
    name = name.removesuffix("/v8") if name == "linux/arm64/v8" else name
    if name not in PLATFORMS:
        raise argparse.ArgumentTypeError(
            f"unsupported platform {text!r} (supported: {', '.join(PLATFORMS)})"
        )
    return PLATFORMS[name]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _build_ca() -> str | None:
    """The CA bundle the host's pip trusts, if it names one (a TLS-inspecting proxy)."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    for conf in (Path("/etc/pip.conf"), Path.home() / ".config/pip/pip.conf"):
        parser = configparser.ConfigParser()
        try:
            parser.read(conf)
        except configparser.Error:
            continue
        cert = parser.get("global", "cert", fallback=None)
        if cert and Path(cert).is_file():
            return cert
    return None


class Builder:
    def __init__(
        self,
        context: Path,
        dockerfile: Path,
        cache: Path,
        build_args: dict[str, str] | None = None,
        platform: Platform | None = None,
    ) -> None:
        self.context = context
        self.platform = platform or host_platform()
        self.plan = df.plan(dockerfile.read_text(), build_args)
        ignore_file = context / ".dockerignore"
        self.ignore = df.DockerIgnore(ignore_file.read_text() if ignore_file.exists() else "")
        # The platform is part of every stage's key: an arm64 root never serves an amd64 build.
        self.salt = f"{builder_salt()}\nplatform {self.platform.name}"
        self.keys = df.stage_keys(self.plan, context, self.ignore, self.salt)
        self.cache = cache
        self.version = project_version(context)
        self.tag = f"{self.version}-{self.keys.final[self.plan.target.index][:12]}"
        self.ref = f"{REPOSITORY}:{self.tag}"
        self.archive = cache / archive_name(self.tag, self.platform)
        # Each platform's stage roots apart: an arm64 build neither reuses nor prunes the
        # amd64 ones (alternating builds, as a release makes, keep both caches warm).
        self.snapshots = cache / "stages" / self.platform.architecture
        self.log_path = cache / "build.log"
        self.work = cache / f"tmp-{os.getpid()}"
        self.roots: dict[int, Path] = {}
        self._log: IO[str] | None = None
        self._run_extras = self._build_extras()

    # ------------------------------------------------------------------ processes

    def _build_extras(self) -> tuple[dict[str, str], list[list[str]]]:
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if os.environ.get(k)}
        binds = []
        if Path("/etc/resolv.conf").exists():
            binds.append(["/etc/resolv.conf", "/etc/resolv.conf"])
        ca = _build_ca()
        if ca:
            binds.append([ca, BUILD_CA_PATH])
            env["PIP_CERT"] = BUILD_CA_PATH
        return env, binds

    def sh(self, what: str, argv: list[str], stdin: Path | None = None) -> None:
        """Runs a host command with its output in the build log; fails with the log's tail."""
        assert self._log is not None
        self._log.write(f"\n### {what}\n$ {' '.join(argv)}\n")
        self._log.flush()
        with stdin.open("rb") if stdin else open(os.devnull, "rb") as inp:
            rc = subprocess.call(argv, stdin=inp, stdout=self._log, stderr=subprocess.STDOUT)
        if rc != 0:
            self._log.flush()
            tail = self.log_path.read_text(errors="replace").splitlines()[-40:]
            raise BuildError(
                f"{what} failed (exit {rc}); last lines of {self.log_path}:\n" + "\n".join(tail)
            )

    def chroot(
        self,
        what: str,
        root: Path,
        argv: list[str],
        env: dict[str, str],
        *,
        workdir: str = "/",
        user: str = "0:0",
        binds: list[list[str]] | None = None,
        stdin: Path | None = None,
    ) -> None:
        """Runs argv in root through chroot.py, in a private mount namespace."""
        spec = {
            "root": str(root),
            "workdir": workdir,
            "user": user,
            "mode": "rw",
            "env": env,
            "argv": argv,
            "binds": binds or [],
            "stdin": str(stdin) if stdin else None,
        }
        self.sh(
            what, private_namespace([sys.executable, str(HERE / "chroot.py"), json.dumps(spec)])
        )

    # ------------------------------------------------------------------ stages

    def debian(self, ref: str, root: Path) -> None:
        argv = debian_argv(ref, root, self.platform)
        self.sh(f"mmdebstrap {ref} ({self.platform.name})", private_namespace(argv))

    def checkpoints(self, stage: df.Stage) -> dict[int, Path]:
        """Cached roots of a stage, by how many of its steps they include: the Debian base
        after FROM, the root before the first COPY (a source change leaves it valid), and
        the whole stage when later stages start FROM it."""
        out: dict[int, Path] = {}
        snapshots = self.snapshots
        if stage.base_ref:
            # Keyed by the exact mmdebstrap command and the reference (its digest), not the
            # whole builder: editing the builder rebuilds the stages, and reuses the base.
            argv = " ".join(debian_argv(stage.base_ref, Path("/ROOT"), self.platform))
            key = hashlib.sha256(f"{argv}\n{stage.base_ref}".encode()).hexdigest()
            name = stage.base_ref.partition("@")[0].replace(":", "-").replace("/", "-")
            name += f"-{self.platform.architecture}"
            out[0] = snapshots / f"from-{name}-{key[:16]}.tar"
        if stage.index in self.keys.before_copy:
            n, key = self.keys.before_copy[stage.index]
            out[n] = snapshots / f"{stage.label()}-before-copy-{key[:16]}.tar"
        if stage.index in self.plan.parents():
            key = self.keys.final[stage.index]
            out[len(stage.steps)] = snapshots / f"{stage.label()}-{key[:16]}.tar"
        return out

    def restore(self, snapshot: Path, root: Path) -> None:
        root.mkdir(parents=True)
        self.sh(
            f"restore {snapshot.name}",
            ["tar", "-xpf", str(snapshot), "--numeric-owner", "-C", str(root)],
        )

    def save(self, root: Path, snapshot: Path) -> None:
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        tmp = snapshot.with_suffix(".tmp")
        self.sh(
            f"snapshot {snapshot.name}",
            ["tar", "-cf", str(tmp), "--numeric-owner", "-C", str(root), "."],
        )
        tmp.rename(snapshot)

    def stage(self, stage: df.Stage) -> None:
        t = time.monotonic()
        root = self.work / stage.label()
        checkpoints = self.checkpoints(stage)
        done = max((n for n, path in checkpoints.items() if path.exists()), default=None)
        if done is not None:
            self.restore(checkpoints[done], root)
            log(f"{stage.label()}: cached through step {done}/{len(stage.steps)}")
        elif stage.base_ref:
            log(f"{stage.label()}: FROM {stage.base_ref}: mmdebstrap (about a minute)")
            self.debian(stage.base_ref, root)
            done = 0
        else:
            assert stage.parent is not None
            self.sh("FROM", ["cp", "-a", str(self.roots[stage.parent]), str(root)])
            done = 0
        total = len(stage.steps)
        for n in range(done, total + 1):
            if n in checkpoints and not checkpoints[n].exists():
                self.save(root, checkpoints[n])
            if n == total:
                break
            step = stage.steps[n]
            t_step = time.monotonic()
            self.step(step, root)
            took = time.monotonic() - t_step
            log(f"{stage.label()} [{n + 1}/{total}] {describe(step, self.plan)}: {took:.1f}s")
        log(f"{stage.label()}: done in {time.monotonic() - t:.0f}s")
        self.roots[stage.index] = root

    def step(self, step: df.Step, root: Path) -> None:
        if isinstance(step, df.MakeDir):
            self.chroot(
                step.where, root, ["mkdir", "-p", "--", step.path], dict(df.DEBIAN_CONFIG_ENV)
            )
        elif isinstance(step, df.Run):
            extra_env, binds = self._run_extras
            env = {"HOME": "/root", **extra_env, **dict(step.env)}
            self.chroot(
                step.where,
                root,
                list(step.argv),
                env,
                workdir=step.workdir,
                user=step.user,
                binds=binds,
            )
        else:
            archive = self.work / "copy.tar"
            self.copy_archive(step, archive)
            # Extracted by the image's own tar inside the root: symbolic links in the
            # destination resolve there, never on the host.
            self.chroot(
                step.where,
                root,
                ["tar", "-xpf", "-", "--numeric-owner", "--no-overwrite-dir", "-C", "/"],
                dict(df.DEBIAN_CONFIG_ENV),
                stdin=archive,
            )
            archive.unlink()

    def copy_archive(self, step: df.Copy, archive: Path) -> None:
        """The files COPY adds, as a tar with their destination paths, owned by root (COPY
        without --chown), modes and times kept."""
        with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
            for src in step.sources:
                if step.from_stage is None:
                    entries = df.context_entries(self.context, src, self.ignore)
                else:
                    entries = stage_entries(self.roots[step.from_stage], src, step.where)
                for rel, path in entries:
                    if rel:
                        target = f"{step.dest}/{rel}"
                    elif step.dest_is_dir:
                        target = f"{step.dest}/{Path(src.rstrip('/')).name}"
                    else:
                        target = step.dest
                    if not (path.is_symlink() or path.is_file() or path.is_dir()):
                        continue  # sockets, fifos, devices: COPY takes none here
                    info = tar.gettarinfo(str(path), arcname=target.lstrip("/"))
                    info.uid = info.gid = 0
                    info.uname = info.gname = "root"
                    if info.isreg():
                        with path.open("rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)

    # ------------------------------------------------------------------ archive

    def pack(self, root: Path, out: Path) -> None:
        layout = self.work / "layout"
        blobs = layout / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        layer_gz = self.work / "layer.tar.gz"
        diff_id = self.layer(root, layer_gz)
        layer = _blob_file(blobs, layer_gz)
        now = created().strftime("%Y-%m-%dT%H:%M:%SZ")
        stages = ", ".join(s.label() for s in self.plan.needed())
        config = {
            "created": now,
            **self.platform.oci,
            "config": self.plan.target.config.to_oci(),
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
            "history": [
                {
                    "created": now,
                    "created_by": f"hack/image/build.sh: Dockerfile stages {stages}",
                }
            ],
        }
        config_desc = _blob_bytes(blobs, _json(config))
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
        }
        manifest_desc = _blob_bytes(blobs, _json(manifest))
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "platform": self.platform.oci,
                    "annotations": {
                        "io.containerd.image.name": self.ref,
                        "org.opencontainers.image.ref.name": self.tag,
                    },
                }
            ],
        }
        (layout / "index.json").write_bytes(_json(index))
        (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
        with tarfile.open(out, "w") as tar:
            for name in ("oci-layout", "index.json", "blobs"):
                tar.add(layout / name, arcname=name, filter=_root_owned)
        shutil.rmtree(layout)

    def layer(self, root: Path, out: Path) -> str:
        """Writes the root as one gzip layer; returns the uncompressed tar's sha256 (the
        diff_id). tar, the hash and gzip run as one pipeline: gzip is the slow part."""
        # What a runtime mounts (/proc, /sys, /dev) is left empty, as in any image.
        tar_cmd = ["tar", "-cf", "-", "--numeric-owner", "--sort=name", "--anchored"]
        tar_cmd += ["--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./dev/*"]
        tar_cmd += ["-C", str(root), "."]
        h = hashlib.sha256()
        with out.open("wb") as sink:
            gz = subprocess.Popen(["gzip", "-n", "-6"], stdin=subprocess.PIPE, stdout=sink)
            tar = subprocess.Popen(tar_cmd, stdout=subprocess.PIPE)
            source, dest = tar.stdout, gz.stdin
            assert source is not None
            assert dest is not None
            while chunk := source.read(1 << 20):
                h.update(chunk)
                dest.write(chunk)
            dest.close()
            if tar.wait() or gz.wait():
                raise BuildError("writing the layer (tar | gzip) failed")
        return h.hexdigest()

    # ------------------------------------------------------------------ main

    def build(self) -> None:
        t0 = time.monotonic()
        self.work.mkdir(parents=True)
        with self.log_path.open("w") as self._log:
            try:
                for stage in self.plan.needed():
                    self.stage(stage)
                tmp = self.archive.with_name(self.archive.name + ".tmp")
                t = time.monotonic()
                self.pack(self.roots[self.plan.target.index], tmp)
                log(f"archive written in {time.monotonic() - t:.0f}s")
                t = time.monotonic()
                verify(tmp, self.ref, self.plan.target.config, self.work / "verify", self.platform)
                log(f"verified in {time.monotonic() - t:.0f}s")
                tmp.rename(self.archive)
            finally:
                remove_tree(self.work)
                for stale in self.cache.glob("*.oci.tar.tmp"):
                    stale.unlink()
        self.prune()
        size = self.archive.stat().st_size / 1e6
        took = time.monotonic() - t0
        log(f"{self.ref} ({self.platform.name}) built in {took:.0f}s ({size:.0f} MB)")

    def prune(self) -> None:
        """Keeps this platform's newest archives, and only the stage snapshots of this
        platform that this build can reuse; other platforms' are left alone."""
        archives = sorted(
            (
                p
                for p in self.cache.glob("vnpu-operator-*.oci.tar")
                if archive_platform(p.name) == self.platform
            ),
            key=lambda p: p.stat().st_mtime,
        )
        for old in archives[:-KEEP_ARCHIVES]:
            old.unlink()
        used = {path for stage in self.plan.needed() for path in self.checkpoints(stage).values()}
        for snap in self.snapshots.glob("*.tar"):
            if snap not in used:
                snap.unlink()
        # Snapshots from before they were kept by platform.
        for snap in (self.cache / "stages").glob("*.tar"):
            snap.unlink()


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def check_emulation(platform: Platform) -> None:
    """A foreign platform's binaries run through qemu-user, registered with binfmt_misc's
    F flag (the kernel opens the interpreter at registration, so it works in chroots that
    have no qemu of their own). build.sh registers it; this says what is missing."""
    entry = BINFMT / f"qemu-{platform.qemu}"
    if not entry.is_file():
        raise BuildError(
            f"building for {platform.name} on {host_platform().name} needs qemu-user: "
            f"no binfmt_misc entry {entry} (hack/image/build.sh registers it as root)"
        )
    fields = dict(line.split(None, 1) for line in entry.read_text().splitlines() if " " in line)
    if entry.read_text().splitlines()[0] != "enabled" or "F" not in fields.get("flags:", ""):
        raise BuildError(
            f"{entry} must be enabled with the F (fix-binary) flag to run inside chroots:\n"
            + entry.read_text()
        )


def created() -> dt.datetime:
    """The config's creation time: SOURCE_DATE_EPOCH when set (reproducible builds' variable,
    e.g. the commit's time), else now."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not epoch:
        return dt.datetime.now(dt.UTC)
    if not epoch.isdigit():
        raise BuildError(f"SOURCE_DATE_EPOCH must be seconds since 1970, got {epoch!r}")
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC)


def build_arg(text: str) -> tuple[str, str]:
    """`NAME=VALUE` of --build-arg (an empty VALUE is a value)."""
    name, eq, value = text.partition("=")
    if not eq or not re.fullmatch(r"\w+", name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def archive_name(tag: str, platform: Platform) -> str:
    """The host's amd64 archive keeps the name the real-node lane has always read;
    another platform's says which it is."""
    if platform.name == "linux/amd64":
        return f"vnpu-operator-{tag}.oci.tar"
    return f"vnpu-operator-{tag}-{platform.architecture}.oci.tar"


def archive_platform(name: str) -> Platform:
    """The platform archive_name() wrote into an archive's name."""
    for platform in PLATFORMS.values():
        if platform.name != "linux/amd64" and name.endswith(f"-{platform.architecture}.oci.tar"):
            return platform
    return PLATFORMS["linux/amd64"]


def debian_argv(ref: str, root: Path, platform: Platform | None = None) -> list[str]:
    """mmdebstrap making `debian:<suite>[-slim]` from Debian's packages into root, for the
    platform's architecture (a foreign one runs its maintainer scripts under qemu-user)."""
    match = df.DEBIAN_REF.fullmatch(ref)
    assert match
    suite = match.group("suite")
    mirror = os.environ.get("VNPU_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    security = os.environ.get(
        "VNPU_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security"
    )
    sources = [f"deb {mirror} {suite} main"]
    if suite not in ("sid", "unstable"):
        sources += [f"deb {mirror} {suite}-updates main", f"deb {security} {suite}-security main"]
    argv = ["mmdebstrap", "--mode=root", "--variant=minbase", f"--hook-dir={MERGED_USR_HOOKS}"]
    if platform is not None and platform != host_platform():
        # Named only for a foreign one: the host's base keeps the command (and cache key)
        # it always had.
        argv.append(f"--architectures={platform.architecture}")
    if match.group("slim"):
        argv += [f"--dpkgopt={opt}" for opt in SLIM_DPKG_OPTIONS]
    # The host's name and resolver stay out of the image (a runtime provides both).
    argv += ['--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"']
    return [*argv, suite, str(root), *sources]


def describe(step: df.Step, plan: df.Plan) -> str:
    if isinstance(step, df.MakeDir):
        return f"WORKDIR {step.path}"
    if isinstance(step, df.Copy):
        flag = "" if step.from_stage is None else f"--from={plan.stages[step.from_stage].label()} "
        return f"COPY {flag}{' '.join(step.sources)} {step.dest}"
    text = " ".join(step.argv[-1].split())
    return "RUN " + (text if len(text) <= 60 else text[:57] + "...")


def _blob_file(blobs: Path, source: Path) -> dict[str, object]:
    digest = _sha256_file(source)
    size = source.stat().st_size
    source.rename(blobs / digest)
    return {"digest": f"sha256:{digest}", "size": size}


def _blob_bytes(blobs: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _json(obj: object) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def private_namespace(argv: list[str]) -> list[str]:
    """argv in its own mount namespace: whatever it mounts is gone when it exits."""
    return ["unshare", "--mount", "--propagation", "private", "--", *argv]


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p.startswith(prefix)]


def remove_tree(path: Path) -> None:
    """Removes a build directory, never while anything is mounted inside it (a host /dev
    bound into a root would be emptied with it)."""
    if not path.exists():
        return
    mounted = _mounts_under(path)
    if mounted:
        raise BuildError(f"not removing {path}: still mounted there: {mounted}")
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


def stage_entries(root: Path, src: str, where: str) -> list[tuple[str, Path]]:
    """What `COPY --from=<stage> <src>` takes: like context_entries, with <src> resolved
    inside that stage's root (its absolute symbolic links point into the root)."""
    path = resolve_in_root(root, src)
    if not (path.exists() or path.is_symlink()):
        raise BuildError(f"{where}: {src} does not exist in that stage")
    if path.is_symlink() or not path.is_dir():
        return [("", path)]
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(path):
        base = Path(dirpath)
        for name in dirnames + filenames:
            entry = base / name
            out.append((entry.relative_to(path).as_posix(), entry))
    return sorted(out)


def resolve_in_root(root: Path, path: str) -> Path:
    """`path` resolved as a process chrooted at `root` would resolve it."""
    parts = [p for p in path.split("/") if p and p != "."]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink() and parts:  # the last component is copied as a link
            hops += 1
            if hops > 40:
                raise BuildError(f"too many symbolic links resolving {path}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def follow_in_root(root: Path, path: str) -> Path:
    """`path` with every symbolic link followed, the last one too, inside root."""
    for _ in range(40):
        resolved = resolve_in_root(root, path)
        if not resolved.is_symlink():
            return resolved
        target = os.readlink(resolved)
        inside = "/" + resolved.relative_to(root).as_posix()
        path = target if target.startswith("/") else f"{os.path.dirname(inside)}/{target}"
    raise BuildError(f"too many symbolic links resolving {path}")


def executable_in_root(root: Path, program: str, path: str) -> Path:
    """The ELF file that `program`, looked up in the image's PATH, makes the kernel run:
    links followed, and a script's `#!` interpreter in its place (a console script)."""
    dirs = [""] if "/" in program else path.split(":")
    candidates = (follow_in_root(root, f"{d}/{program}") for d in dirs)
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise BuildError(f"{program} is not in the image's PATH {path}")
    for _ in range(4):
        with found.open("rb") as f:
            head = f.readline(256)
        if not head.startswith(b"#!"):
            return found
        interpreter = head[2:].split()[0].decode()
        found = follow_in_root(root, interpreter)
    raise BuildError(f"{program}: too many #! interpreters")


# ---------------------------------------------------------------------- verification


ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}  # e_machine: EM_X86_64, EM_AARCH64


def elf_machine(path: Path) -> str:
    """The machine an ELF executable is built for, read from its header (e_machine)."""
    with path.open("rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        raise BuildError(f"{path} is not an ELF file")
    number = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    return ELF_MACHINES.get(number, f"e_machine {number:#x}")


def verify(
    archive: Path,
    ref: str,
    expected: df.Config,
    work: Path,
    platform: Platform | None = None,
) -> None:
    """Checks an archive without a container runtime: layout, digests, the platform, the
    config the Dockerfile declares, then every entrypoint started with --help from the
    unpacked layers, as the image's user, with its environment, on a read-only root (under
    qemu-user for a foreign platform)."""
    platform = platform or host_platform()
    work.mkdir(parents=True)
    layout = work / "layout"
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not (member.isfile() or member.isdir()) or not LAYOUT_NAME.fullmatch(member.name):
                raise BuildError(f"unexpected entry {member.name!r} in {archive.name}")
        tar.extractall(layout)  # names checked above (Debian's 3.11.2 has no filter= yet)
    if json.loads((layout / "oci-layout").read_text()) != {"imageLayoutVersion": "1.0.0"}:
        raise BuildError("oci-layout is not version 1.0.0")

    def blob(desc: dict[str, object]) -> Path:
        algo, _, digest = str(desc["digest"]).partition(":")
        path = layout / "blobs" / algo / digest
        if _sha256_file(path) != digest or path.stat().st_size != desc["size"]:
            raise BuildError(f"blob {desc['digest']} does not match its digest or size")
        return path

    index = json.loads((layout / "index.json").read_text())
    (desc,) = index["manifests"]
    name = desc.get("annotations", {}).get("io.containerd.image.name")
    if name != ref:
        raise BuildError(f"index.json names {name!r}, expected {ref!r}")
    if desc.get("platform") != platform.oci:
        raise BuildError(f"index.json's platform is {desc.get('platform')}, not {platform.oci}")
    manifest = json.loads(blob(desc).read_text())
    image = json.loads(blob(manifest["config"]).read_text())
    got = {k: image.get(k) for k in platform.oci}
    if got != platform.oci or ("variant" in image and "variant" not in platform.oci):
        raise BuildError(f"the config's platform is {got}, not {platform.oci}")
    config = image["config"]
    if config != expected.to_oci():
        raise BuildError(
            f"the image config differs from the Dockerfile's:\n{config}\n{expected.to_oci()}"
        )
    user = config.get("User", "")
    if not user.split(":")[0].isdigit() or int(user.split(":")[0]) == 0:
        raise BuildError(f"User {user!r} must be numeric and not root")

    root = work / "rootfs"
    root.mkdir()
    diff_ids = []
    for layer in manifest["layers"]:
        h = hashlib.sha256()
        proc = subprocess.Popen(
            ["tar", "-xpf", "-", "--numeric-owner", "-C", str(root)], stdin=subprocess.PIPE
        )
        assert proc.stdin is not None
        with gzip.open(blob(layer), "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
                proc.stdin.write(chunk)
        proc.stdin.close()
        if proc.wait():
            raise BuildError("unpacking a layer failed")
        diff_ids.append(f"sha256:{h.hexdigest()}")
    if diff_ids != image["rootfs"]["diff_ids"]:
        raise BuildError("the layers' diff_ids differ from the config's")
    if any(p.name.startswith(".wh.") for p in root.rglob(".wh.*")):
        raise BuildError("whiteouts found: this verifier reads single-layer images only")

    env = dict(e.split("=", 1) for e in config.get("Env", []))
    workdir = config.get("WorkingDir") or "/"
    default = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    commands = [default] + [
        [e] for e in config.get("Labels", {}).get("io.vnpu.entrypoints", "").split()
    ]
    # What the entrypoints execute must be the platform's: a build that ran the host's
    # binaries would pass --help as well.
    path = env.get("PATH", df.DEBIAN_CONFIG_ENV["PATH"])
    for program in sorted({argv[0] for argv in commands} | {"sh"}):
        binary = executable_in_root(root, program, path)
        machine = elf_machine(binary)
        if machine != platform.machine:
            raise BuildError(f"{program} runs {binary.relative_to(root)}, an {machine} binary")
        log(f"verified: {program} runs /{binary.relative_to(root)}, an {machine} ELF binary")
    seen: list[list[str]] = []
    runner = Verifier(root, env, workdir, user)
    for argv in commands:
        if argv in seen:
            continue
        seen.append(argv)
        out = runner.run([*argv, "--help"])
        if "usage:" not in out:
            raise BuildError(f"{' '.join(argv)} --help printed no usage:\n{out}")
        log(f"verified: {' '.join(argv)} --help starts as user {user} on a read-only root")
    version = runner.run(
        ["python", "-c", "import sys; print(sys.version.split()[0], sys.executable)"]
    )
    log(f"verified: image Python {version.strip()}")
    remove_tree(work)


class Verifier:
    def __init__(self, root: Path, env: dict[str, str], workdir: str, user: str) -> None:
        self.root, self.env, self.workdir, self.user = root, env, workdir, user

    def run(self, argv: list[str]) -> str:
        spec = {
            "root": str(self.root),
            "workdir": self.workdir,
            "user": self.user,
            "mode": "ro",
            "env": self.env,
            "argv": argv,
        }
        cmd = private_namespace([sys.executable, str(HERE / "chroot.py"), json.dumps(spec)])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise BuildError(
                f"`{' '.join(argv)}` failed in the image (exit {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}"
            )
        return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/image/build.sh", description=__doc__)
    parser.add_argument(
        "--print", action="store_true", help="print the archive path, build nothing"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="rebuild every stage, base included"
    )
    parser.add_argument(
        "--platform",
        type=platform_arg,
        default=None,
        metavar="linux/amd64|linux/arm64",
        help="the image's platform (default: the host's); a foreign one runs under qemu-user",
    )
    parser.add_argument(
        "--emulator",
        action="store_true",
        help="print the binfmt_misc entry the platform needs (nothing when native), build nothing",
    )
    parser.add_argument("--dockerfile", type=Path, default=DEFAULT_DOCKERFILE)
    parser.add_argument("--context", type=Path, default=ROOT)
    parser.add_argument(
        "--build-arg",
        type=build_arg,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="as docker build's (e.g. REVISION, CREATED for the image's labels)",
    )
    args = parser.parse_args(argv)
    try:
        if args.emulator:
            platform = args.platform or host_platform()
            print("" if platform == host_platform() else f"qemu-{platform.qemu}")
            return 0
        cache = cache_dir()
        builder = Builder(args.context, args.dockerfile, cache, dict(args.build_arg), args.platform)
        if args.print:
            print(builder.archive)
            return 0
        if builder.archive.exists() and not args.no_cache:
            log(f"{builder.ref}: cached")
            print(builder.archive)
            return 0
        if os.geteuid() != 0:
            raise BuildError("building the image needs root (mmdebstrap, chroot, mount)")
        if args.no_cache:
            remove_tree(builder.snapshots)
        cache.mkdir(parents=True, exist_ok=True)
        if builder.platform != host_platform():
            check_emulation(builder.platform)
        log(
            f"building {builder.ref} for {builder.platform.name} from {args.dockerfile} "
            f"(log: {builder.log_path})"
        )
        builder.build()
        print(builder.archive)
        return 0
    except (df.DockerfileError, BuildError) as e:
        log(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
