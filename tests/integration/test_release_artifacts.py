"""The release's pieces (hack/release) on small images: the archives keep the builder's
manifests and name one multi-platform index, the packaged chart runs that index by
digest, and the verify command docs/RELEASING.md gives passes on a release and fails on
a tampered one. With the pinned cosign (hack/tools) and the plane's helm; the SBOMs and
the real images are test_real_node_release.py's."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from release_harness import run_verify

from localplane import ociimage
from release import build, oci, sign

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
TAG = "9.8.7-rc.1"
PLATFORMS = ("linux/amd64", "linux/arm64")


def fake_image(tmp: Path, target: str) -> Path:
    """A one-file image for `target`, as hack/image/build.sh would archive it."""
    arch = target.split("/")[1]
    content = tmp / f"hello-{arch}"
    content.write_text(f"an image for {target}\n")
    archive = tmp / f"vnpu-operator-{TAG}-abc-{arch}.oci.tar"
    layer = ociimage.Layer(files={f"/hello-{arch}": content})
    ociimage.write_archive(archive, f"docker.io/library/vnpu-operator:{TAG}-abc", layer,
                           cmd=["/hello"], arch=arch)  # fmt: skip
    return archive


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    tmp = Path(tmp_path_factory.mktemp("release-src"))
    images = {target: fake_image(tmp, target) for target in PLATFORMS}
    source = build.Source(tag=TAG, revision="0" * 40, created="2026-12-02T00:00:00Z",
                          repository="registry.example.com/vnpu/vnpu-operator")  # fmt: skip
    out = build.assemble(tmp / "dist" / TAG, source, images, sboms=False)
    return out, images


def manifest_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        f = tar.extractfile("index.json")
        assert f is not None
        digest: str = json.load(f)["manifests"][0]["digest"]
    return digest


def blobs(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {m.name.rsplit("/", 1)[1] for m in tar.getmembers() if m.name.count("/") == 2}


def test_the_release_holds_every_artifact_signed(release: tuple[Path, dict[str, Path]]) -> None:
    out, _ = release
    artifacts = {
        f"vnpu-operator-{TAG}.tgz",
        f"vnpu-operator-{TAG}.oci.tar",
        f"vnpu-operator-{TAG}-linux-amd64.oci.tar",
        f"vnpu-operator-{TAG}-linux-arm64.oci.tar",
        "release.json",
        "cosign.pub",
    }
    summed = {line.split("  ")[1] for line in (out / "SHA256SUMS").read_text().splitlines()}
    assert summed == artifacts
    bundles = {f"{name}{sign.BUNDLE_SUFFIX}" for name in [*artifacts, "SHA256SUMS"]}
    assert {p.name for p in out.iterdir()} == artifacts | bundles | {"SHA256SUMS"}


def test_the_archives_name_one_index_of_the_builders_manifests(
    release: tuple[Path, dict[str, Path]],
) -> None:
    out, images = release
    meta = json.loads((out / "release.json").read_text())
    digest = meta["image"]["digest"]
    sources = {t: manifest_digest(a) for t, a in images.items()}
    assert meta["image"]["platforms"] == sources
    repo = "registry.example.com/vnpu/vnpu-operator"
    for name in (f"{TAG}", f"{TAG}-linux-amd64", f"{TAG}-linux-arm64"):
        archive = out / f"vnpu-operator-{name}.oci.tar"
        top, index = oci.archive_index(archive)
        names = [m["annotations"][oci.NAME] for m in top["manifests"]]
        assert names == [f"{repo}:{TAG}", f"{repo}@{digest}"]
        assert {m["digest"] for m in top["manifests"]} == {digest}
        listed = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
                  for m in index["manifests"]}  # fmt: skip
        assert listed == sources
    # One platform's archive holds its own image's blobs and not the other's.
    amd64, arm64 = (
        blobs(out / f"vnpu-operator-{TAG}-linux-{a}.oci.tar") for a in ("amd64", "arm64")
    )
    everything = blobs(out / f"vnpu-operator-{TAG}.oci.tar")
    assert blobs(images["linux/amd64"]) <= amd64
    assert not (blobs(images["linux/arm64"]) - blobs(images["linux/amd64"])) & amd64
    assert amd64 | arm64 == everything


def test_the_packaged_chart_runs_the_release_image_by_digest(
    release: tuple[Path, dict[str, Path]],
) -> None:
    out, _ = release
    digest = json.loads((out / "release.json").read_text())["image"]["digest"]
    helm = build.helm_binary()
    chart = out / f"vnpu-operator-{TAG}.tgz"
    show = [str(helm), "show", "chart", str(chart)]
    shown = yaml.safe_load(subprocess.run(show, capture_output=True, text=True, check=True).stdout)
    assert shown["version"] == shown["appVersion"] == TAG
    rendered = subprocess.run(
        [str(helm), "template", "r", str(chart), "-n", "vnpu-system", "--kube-version", "1.34.0"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    images: set[str] = set()
    for doc in yaml.safe_load_all(rendered):
        spec: dict[str, Any] | None = None
        if doc and doc["kind"] in ("Deployment", "DaemonSet", "Job"):
            spec = doc["spec"]["template"]["spec"]
        elif doc and doc["kind"] == "Pod":
            spec = doc["spec"]
        if spec:
            images |= {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
    assert images == {f"registry.example.com/vnpu/vnpu-operator@{digest}"}
    # The digest is the index the archives carry, byte for byte.
    _, index = oci.archive_index(out / f"vnpu-operator-{TAG}.oci.tar")
    assert len(index["manifests"]) == 2


def test_the_documented_verify_command_passes_and_prints_the_named_key(
    release: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    out, _ = release
    copy = tmp_path / TAG
    shutil.copytree(out, copy)
    proc = run_verify(copy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": OK") == 6, proc.stdout
    assert proc.stderr.count("Verified OK") == 7, proc.stderr
    meta = json.loads((copy / "release.json").read_text())
    fingerprint = proc.stdout.strip().splitlines()[-1].split()[0]
    assert fingerprint == meta["signingKey"]["sha256Fingerprint"]
    assert meta["signingKey"]["throwaway"] is True


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_verify_command_fails_on_a_changed_archive(
    release: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    out, _ = release
    copy = tmp_path / TAG
    shutil.copytree(out, copy)
    archive = copy / f"vnpu-operator-{TAG}-linux-amd64.oci.tar"
    _flip_a_byte(archive)
    proc = run_verify(copy)
    assert proc.returncode != 0
    assert f"vnpu-operator-{TAG}-linux-amd64.oci.tar: FAILED" in proc.stdout
    with pytest.raises(sign.SignError, match="not the one in SHA256SUMS"):
        sign.verify(sign.cosign_binary(), copy)


def test_the_verify_command_fails_when_the_sums_are_rewritten_to_match(
    release: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    """Tampering that also rewrites SHA256SUMS passes the checksums but not the signatures."""
    out, _ = release
    copy = tmp_path / TAG
    shutil.copytree(out, copy)
    chart = copy / f"vnpu-operator-{TAG}.tgz"
    _flip_a_byte(chart)
    sums = copy / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    new = hashlib.sha256(chart.read_bytes()).hexdigest()
    sums.write_text("".join(
        f"{new}  {chart.name}\n" if line.endswith(f"  {chart.name}") else f"{line}\n"
        for line in lines
    ))  # fmt: skip
    proc = run_verify(copy)
    assert proc.returncode != 0
    assert "Verified OK" not in proc.stderr.splitlines()[-1]
    assert "invalid signature" in proc.stderr, proc.stderr


def test_a_signature_by_another_key_is_refused(
    release: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    out, _ = release
    copy = tmp_path / TAG
    shutil.copytree(out, copy)
    cosign = sign.cosign_binary()
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run([str(cosign), "generate-key-pair"], cwd=other, env={"COSIGN_PASSWORD": ""},
                   capture_output=True, check=True)  # fmt: skip
    rogue = sign.Key(str(other / "cosign.key"), "rogue", throwaway=True)
    sign.sign(cosign, rogue, copy / "release.json")
    proc = run_verify(copy)
    assert proc.returncode != 0
    assert proc.stderr.count("Verified OK") < 7


def test_a_dirty_tree_is_refused_unless_allowed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a").write_text("a\n")
    subprocess.run([*git, "add", "a"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    assert build.check_clean(repo) == []
    (repo / "a").write_text("changed\n")
    (repo / "new").write_text("untracked\n")
    with pytest.raises(build.ReleaseError, match="ALLOW_DIRTY=1") as refused:
        build.check_clean(repo)
    assert " M a" in str(refused.value)
    assert "?? new" in str(refused.value)
    assert len(build.check_clean(repo, allow_dirty=True)) == 2
