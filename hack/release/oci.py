"""The release's image archives, made from the single-platform archives of
hack/image/build.sh without rebuilding or repacking anything: the platforms' manifests
(and so their digests) are the builder's, byte for byte.

A release names one multi-platform image index, `<repository>:<version>`; the chart pins
that index's digest. Each archive carries the index, named twice in its index.json (by tag
and by digest, so that containerd's CRI finds a pod's `repository@sha256:...` among the
images `ctr images import` made), and the blobs of the platforms it is for:

- `vnpu-operator-<version>-linux-<arch>.oci.tar`: one platform's blobs, for a node of
  that architecture to import (the other platform's manifest is named but absent, which
  containerd's import for one platform allows);
- `vnpu-operator-<version>.oci.tar`: every platform's, for a registry
  (`skopeo copy --all --preserve-digests oci-archive:...:<version> docker://...`).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
NAME = "io.containerd.image.name"
REF_NAME = "org.opencontainers.image.ref.name"


class OCIError(Exception):
    pass


def normalize(repository: str) -> str:
    """`repository` as containerd (and Kubernetes' CRI) names it: `vnpu-operator` is
    `docker.io/library/vnpu-operator`, `me/x` is `docker.io/me/x`."""
    first, _, rest = repository.partition("/")
    if not rest:
        return f"docker.io/library/{repository}"
    if "." in first or ":" in first or first == "localhost":
        return repository
    return f"docker.io/{repository}"


@dataclass(frozen=True)
class Platform:
    """One platform's image, as a single-platform archive holds it."""

    os: str
    architecture: str
    variant: str | None  # arm64's v8
    manifest: dict[str, Any]  # its descriptor: mediaType, digest, size
    blobs: dict[str, bytes | Path]  # digest (hex) -> content, or the archive it is in

    @property
    def name(self) -> str:
        return f"{self.os}/{self.architecture}"

    def oci_platform(self) -> dict[str, str]:
        out = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            out["variant"] = self.variant
        return out


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_platform(archive: Path) -> Platform:
    """The image of a single-platform OCI archive: its manifest, and the platform its
    config names (the config, not the file's name, says what the image is for)."""
    with tarfile.open(archive) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}

        def read(name: str) -> bytes:
            member = members.get(name)
            f = tar.extractfile(member) if member else None
            if f is None:
                raise OCIError(f"{archive.name}: no {name}")
            return f.read()

        index = json.loads(read("index.json"))
        manifests = index.get("manifests", [])
        if len(manifests) != 1 or manifests[0].get("mediaType") != MANIFEST_MEDIA_TYPE:
            raise OCIError(f"{archive.name}: expected one image manifest in index.json")
        desc = manifests[0]
        manifest_bytes = read(blob_name(desc["digest"]))
        if "sha256:" + _sha256(manifest_bytes) != desc["digest"]:
            raise OCIError(f"{archive.name}: the manifest does not match its digest")
        manifest = json.loads(manifest_bytes)
        config_bytes = read(blob_name(manifest["config"]["digest"]))
        if "sha256:" + _sha256(config_bytes) != manifest["config"]["digest"]:
            raise OCIError(f"{archive.name}: the config does not match its digest")
        config = json.loads(config_bytes)
        for layer in manifest["layers"]:
            if blob_name(layer["digest"]) not in members:
                raise OCIError(f"{archive.name}: layer {layer['digest']} is missing")
    blobs: dict[str, bytes | Path] = {
        desc["digest"][7:]: manifest_bytes,
        manifest["config"]["digest"][7:]: config_bytes,
    }
    for layer in manifest["layers"]:
        blobs.setdefault(layer["digest"][7:], archive)
    return Platform(
        os=config["os"],
        architecture=config["architecture"],
        variant=config.get("variant"),
        manifest={k: desc[k] for k in ("mediaType", "digest", "size")},
        blobs=blobs,
    )


def blob_name(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or len(hexdigest) != 64:
        raise OCIError(f"unsupported digest {digest!r}")
    return f"blobs/sha256/{hexdigest}"


def image_index(platforms: list[Platform]) -> bytes:
    """The multi-platform image index, deterministic: same manifests, same digest."""
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [
            {**p.manifest, "platform": p.oci_platform()}
            for p in sorted(platforms, key=lambda p: p.name)
        ],
    }
    return json.dumps(index, indent=2, sort_keys=True).encode() + b"\n"


def write_archive(
    out: Path, index: bytes, platforms: list[Platform], repository: str, tag: str
) -> str:
    """Writes an OCI layout archive holding `index` and the blobs of `platforms`;
    returns the index's digest (`sha256:...`)."""
    digest = "sha256:" + _sha256(index)
    ref = normalize(repository)
    desc = {"mediaType": INDEX_MEDIA_TYPE, "digest": digest, "size": len(index)}
    top = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [
            {**desc, "annotations": {NAME: f"{ref}:{tag}", REF_NAME: tag}},
            {**desc, "annotations": {NAME: f"{ref}@{digest}"}},
        ],
    }
    blobs: dict[str, bytes | Path] = {digest[7:]: index}
    for p in platforms:
        blobs.update(p.blobs)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add(tar, "index.json", json.dumps(top, indent=2, sort_keys=True).encode() + b"\n")
        for name in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for hexdigest, content in sorted(blobs.items()):
            if isinstance(content, bytes):
                _add(tar, f"blobs/sha256/{hexdigest}", content)
            else:
                _copy_member(tar, content, f"blobs/sha256/{hexdigest}")
    tmp.replace(out)
    return digest


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _copy_member(tar: tarfile.TarFile, archive: Path, name: str) -> None:
    """Streams one blob from another archive, checking its digest on the way."""
    with tarfile.open(archive) as src:
        member = next((m for m in src.getmembers() if m.name.removeprefix("./") == name), None)
        f = src.extractfile(member) if member else None
        if member is None or f is None:
            raise OCIError(f"{archive.name}: no {name}")
        info = tarfile.TarInfo(name)
        info.size, info.mode = member.size, 0o644
        hashing = _HashingReader(f)
        tar.addfile(info, hashing)
        if hashing.hexdigest() != name.rsplit("/", 1)[1]:
            raise OCIError(f"{archive.name}: {name} does not match its digest")


class _HashingReader(io.RawIOBase):
    def __init__(self, f: IO[bytes]) -> None:
        self._f, self._h = f, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._h.update(data)
        return data

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def archive_index(archive: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A release archive's index.json and the image index it names (for checks)."""
    with tarfile.open(archive) as tar:
        f = tar.extractfile("index.json")
        if f is None:
            raise OCIError(f"{archive.name}: no index.json")
        top = json.load(f)
        digest = top["manifests"][0]["digest"]
        g = tar.extractfile(blob_name(digest))
        if g is None:
            raise OCIError(f"{archive.name}: no image index {digest}")
        data = g.read()
    if "sha256:" + _sha256(data) != digest:
        raise OCIError(f"{archive.name}: the image index does not match its digest")
    return top, json.loads(data)
