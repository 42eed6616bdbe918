"""`make release`: a release's versioned artifacts, from a clean tree, under one directory.

    dist/<version>/
      vnpu-operator-<version>.tgz                  the chart; its image pinned by digest
      vnpu-operator-<version>.oci.tar              the image, every platform (for a registry)
      vnpu-operator-<version>-linux-<arch>.oci.tar the image, one platform (for a node)
      vnpu-operator-<version>-linux-<arch>.spdx.json   the SBOM of that platform's image
      release.json                                 version, commit, digests, the signing key
      cosign.pub                                   the signing key's public half
      SHA256SUMS                                   every file above
      <file>.sigstore.json                         a cosign signature of each file above

The images are hack/image/build.sh's archives (cached by their inputs), built with the
commit and its time in their labels; the release names them `<repository>:<version>` and
indexes them as one multi-platform image (release/oci.py). Settings, from the environment:

    PLATFORMS="linux/amd64 linux/arm64"   (the default: both, where the builder can)
    RELEASE_REPOSITORY=vnpu-operator      the image repository the chart defaults to
    RELEASE_DIR=dist                      where <version>/ goes
    RELEASE_SIGNING_KEY, RELEASE_KEY_NAME, COSIGN_PASSWORD   (release/sign.py)
    ALLOW_DIRTY=1                         build from a tree with uncommitted changes
    RELEASE_LABELS=0                      images without the commit labels (tests only)
    HELM=/path/to/helm                    (default: the local plane's pinned helm)
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from release import oci, sign, version

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vnpu-operator"
IMAGE_SCRIPT = ROOT / "hack" / "image" / "build.sh"
PLANE_SCRIPT = ROOT / "hack" / "plane" / "build.sh"
TOOLS_SCRIPT = ROOT / "hack" / "tools" / "build.sh"
DEFAULT_PLATFORMS = ("linux/amd64", "linux/arm64")


class ReleaseError(Exception):
    pass


def log(message: str) -> None:
    print(f"[release] {message}", file=sys.stderr, flush=True)


def git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def dirty_paths(root: Path = ROOT) -> list[str]:
    """Tracked changes and untracked files git does not ignore."""
    lines = git("status", "--porcelain", root=root).splitlines()
    return [line for line in lines if line.strip()]


def check_clean(root: Path = ROOT, allow_dirty: bool = False) -> list[str]:
    """The uncommitted changes, refused unless `allow_dirty` (ALLOW_DIRTY=1)."""
    dirty = dirty_paths(root)
    if dirty and not allow_dirty:
        raise ReleaseError(
            "the tree has uncommitted changes; a release is built from a commit:\n  "
            + "\n  ".join(dirty[:20])
            + "\ncommit or remove them, or set ALLOW_DIRTY=1 (the release then says so)"
        )
    if dirty:
        log(f"ALLOW_DIRTY=1: building with {len(dirty)} uncommitted changes")
    return dirty


def host_platform() -> str:
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    if arch is None:
        raise ReleaseError(f"unsupported machine {platform.machine()}")
    return f"linux/{arch}"


def builder_has_platform_flag() -> bool:
    """Whether hack/image/build.sh builds for a platform other than the host's."""
    return '"--platform"' in (ROOT / "hack" / "image" / "build.py").read_text()


def platforms_wanted() -> list[str]:
    text = os.environ.get("PLATFORMS", "").replace(",", " ").split()
    wanted = text or list(DEFAULT_PLATFORMS)
    for p in wanted:
        if p not in DEFAULT_PLATFORMS:
            raise ReleaseError(f"PLATFORMS: {p} is not one of {' '.join(DEFAULT_PLATFORMS)}")
    if not builder_has_platform_flag():
        host = host_platform()
        others = [p for p in wanted if p != host]
        if others and text:
            raise ReleaseError(
                f"hack/image/build.sh builds only for this host ({host}), not {others}"
            )
        if others:
            log(f"hack/image/build.sh has no --platform yet: building {host} only")
        wanted = [host]
    return sorted(dict.fromkeys(wanted))


def run_script(script: Path, *args: str, env: dict[str, str] | None = None) -> Path:
    """One of the cached build scripts; the path it prints last. Its log goes to stderr."""
    proc = subprocess.run(
        ["bash", str(script), *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise ReleaseError(f"{script.relative_to(ROOT)} {' '.join(args)} failed (see above)")
    return Path(proc.stdout.strip().splitlines()[-1])


def build_image(target: str, revision: str, created: str, epoch: str) -> Path:
    args = ["--build-arg", f"REVISION={revision}", "--build-arg", f"CREATED={created}"]
    if not commit_labels():
        args = []
    if builder_has_platform_flag():
        args = ["--platform", target, *args]
    env = {"SOURCE_DATE_EPOCH": epoch, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    return run_script(IMAGE_SCRIPT, *args, env=env)


def commit_labels() -> bool:
    """Whether the images name the commit in their labels. RELEASE_LABELS=0 is for the
    real-node test: the image is then `make image`'s archive, already built (a cache hit)."""
    return os.environ.get("RELEASE_LABELS", "1") != "0"


def helm_binary() -> Path:
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    bin_dir = subprocess.run(
        ["bash", str(PLANE_SCRIPT), "--print"], capture_output=True, text=True, check=True
    ).stdout.strip()
    helm = Path(bin_dir) / "helm"
    if not helm.is_file():
        raise ReleaseError(f"no helm at {helm}: run `make plane-main`, or set HELM")
    return helm


def pin_chart_image(chart: Path, repository: str, digest: str, tag: str) -> None:
    """The chart copy's image values: the release's repository, its index digest (which
    the templates prefer over the tag). Only those lines change; the comments stay."""
    values = chart / "values.yaml"
    text = values.read_text()
    block = re.search(r"(?ms)^image:\n(?:  .*\n)+", text)
    if block is None:
        raise ReleaseError("values.yaml has no image: block")
    image = block.group(0)
    image, n_repo = re.subn(r"(?m)^  repository: .*$", f"  repository: {repository}", image)
    image, n_digest = re.subn(r'(?m)^  digest: ""$', f'  digest: "{digest}"', image)
    if n_repo != 1 or n_digest != 1:
        raise ReleaseError("values.yaml: image.repository and an empty image.digest expected")
    values.write_text(text.replace(block.group(0), image, 1))
    loaded = yaml.safe_load(values.read_text())["image"]
    if (loaded["repository"], loaded["digest"], loaded["tag"]) != (repository, digest, ""):
        raise ReleaseError(f"values.yaml's image reads back as {loaded}")
    meta = chart / "Chart.yaml"
    text = meta.read_text()
    new, n = re.subn(
        r"(?m)^(      image: )vnpu-operator:.*$", rf"\g<1>{repository}:{tag}@{digest}", text
    )
    if n != 1:
        raise ReleaseError("Chart.yaml: no artifacthub.io/images line for vnpu-operator")
    meta.write_text(new)


def package_chart(out: Path, repository: str, digest: str, tag: str) -> Path:
    with tempfile.TemporaryDirectory(prefix="vnpu-release-chart-") as tmp:
        chart = Path(tmp) / "vnpu-operator"
        shutil.copytree(CHART, chart)
        pin_chart_image(chart, repository, digest, tag)
        # The version is the release's: equal to Chart.yaml's in a release (build()
        # checks), and the tests' own on their small images.
        argv = [str(helm_binary()), "package", str(chart), "--destination", str(out)]
        argv += ["--version", tag, "--app-version", tag]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ReleaseError(f"helm package failed:\n{proc.stderr}")
    return out / f"vnpu-operator-{tag}.tgz"


def write_sbom(archive: Path, out: Path, name: str, tag: str) -> None:
    """An SPDX JSON SBOM of one platform's image, by syft (Debian and Python packages)."""
    syft = run_script(TOOLS_SCRIPT, "syft")
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    proc = subprocess.run(
        [str(syft), "scan", f"oci-archive:{archive}", "--quiet",
         "--source-name", name, "--source-version", tag, "-o", f"spdx-json={out}"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ReleaseError(f"syft failed on {archive.name}:\n{proc.stderr[-3000:]}")


def sbom_packages(sbom: Path) -> dict[str, set[str]]:
    """The package names of an SPDX SBOM by kind: `deb` and `pypi` (from their purls)."""
    doc = json.loads(sbom.read_text())
    out: dict[str, set[str]] = {}
    for package in doc.get("packages", []):
        for ref in package.get("externalRefs", []):
            if ref.get("referenceType") == "purl":
                kind = ref["referenceLocator"].removeprefix("pkg:").split("/", 1)[0]
                out.setdefault(kind, set()).add(package["name"])
    return out


@dataclass(frozen=True)
class Source:
    """What a release is of: the version, its commit and the image repository."""

    tag: str
    revision: str
    created: str
    repository: str


def assemble(out: Path, source: Source, images: dict[str, Path], *, sboms: bool = True) -> Path:
    """Writes the release into `out` (emptied first) from the builder's single-platform
    archives (platform -> archive): the image archives, the SBOMs, the chart, release.json,
    SHA256SUMS and the signatures, then checks them as docs/RELEASING.md does."""
    tag, repository = source.tag, source.repository
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    timings: dict[str, float] = {}

    t = time.monotonic()
    built: dict[str, tuple[Path, oci.Platform]] = {}
    for target, archive in sorted(images.items()):
        image = oci.read_platform(archive)
        if image.name != target:
            raise ReleaseError(f"{archive.name} is an image for {image.name}, not {target}")
        built[target] = (archive, image)
    platforms = [image for _, image in built.values()]
    index = oci.image_index(platforms)
    digest = oci.write_archive(
        out / f"vnpu-operator-{tag}.oci.tar", index, platforms, repository, tag
    )
    for target, (_, image) in built.items():
        name = f"vnpu-operator-{tag}-{target.replace('/', '-')}.oci.tar"
        oci.write_archive(out / name, index, [image], repository, tag)
    timings["archives"] = time.monotonic() - t

    if sboms:
        t = time.monotonic()
        for target, (archive, _) in built.items():
            sbom = out / f"vnpu-operator-{tag}-{target.replace('/', '-')}.spdx.json"
            write_sbom(archive, sbom, oci.normalize(repository), tag)
            kinds = sbom_packages(sbom)
            if not kinds.get("deb") or not kinds.get("pypi"):
                raise ReleaseError(f"{sbom.name} lists no Debian or no Python packages")
        timings["sboms"] = time.monotonic() - t

    t = time.monotonic()
    chart = package_chart(out, repository, digest, tag)
    timings["chart"] = time.monotonic() - t

    t = time.monotonic()
    cosign = sign.cosign_binary()
    key = sign.release_key(cosign)
    key_fingerprint = sign.write_public_key(cosign, key, out / sign.PUBLIC_KEY)
    manifest: dict[str, Any] = {
        "version": tag,
        "revision": source.revision,
        "created": source.created,
        "chart": chart.name,
        "image": {
            "repository": repository,
            "reference": f"{oci.normalize(repository)}:{tag}@{digest}",
            "digest": digest,
            "platforms": {t: image.manifest["digest"] for t, (_, image) in built.items()},
        },
        "signingKey": {
            "name": key.name,
            "publicKey": sign.PUBLIC_KEY,
            "sha256Fingerprint": key_fingerprint,
            "throwaway": key.throwaway,
        },
    }
    (out / "release.json").write_text(json.dumps(manifest, indent=2) + "\n")
    files = sorted(p.name for p in out.iterdir())
    sums = sign.write_sums(out, files)
    for name in [*files, sums.name]:
        sign.sign(cosign, key, out / name)
    sign.verify(cosign, out)
    for path in out.iterdir():
        path.chmod(0o644)  # cosign writes its files 0600: a release is for publishing
    timings["sign_and_verify"] = time.monotonic() - t

    log(f"release {tag}: image {digest}, key {key.name} (sha256 {key_fingerprint})")
    for path in sorted(out.iterdir()):
        if not path.name.endswith(sign.BUNDLE_SUFFIX):
            log(f"  {path.stat().st_size / 1e6:9.2f} MB  {path.name}")
    log("  " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return out


def build(out_root: Path) -> Path:
    t0 = time.monotonic()
    dirty = check_clean(ROOT, os.environ.get("ALLOW_DIRTY") == "1")
    wrong = version.problems(ROOT)
    if wrong:
        raise ReleaseError("the versions disagree:\n  " + "\n  ".join(wrong))
    source = Source(
        tag=version.project_version(ROOT),
        revision=git("rev-parse", "HEAD") + ("-dirty" if dirty else ""),
        created=git("log", "-1", "--format=%cI"),
        repository=os.environ.get("RELEASE_REPOSITORY", "").strip() or "vnpu-operator",
    )
    epoch = git("log", "-1", "--format=%ct")
    targets = platforms_wanted()
    if not commit_labels():
        log("RELEASE_LABELS=0: the images do not name the commit (a test release)")
    log(f"release {source.tag} of {source.revision[:12]} for {' '.join(targets)}")
    t = time.monotonic()
    images = {t: build_image(t, source.revision, source.created, epoch) for t in targets}
    log(f"images in {time.monotonic() - t:.0f}s")
    out = assemble(out_root / source.tag, source, images)
    log(f"built in {time.monotonic() - t0:.0f}s: {out}")
    return out


def main() -> int:
    out_root = Path(os.environ.get("RELEASE_DIR") or ROOT / "dist")
    try:
        out = build(out_root.resolve())
    except (ReleaseError, oci.OCIError, sign.SignError, version.VersionError) as e:
        log(f"error: {e}")
        return 1
    print(out)
    return 0
