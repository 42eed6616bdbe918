"""The real node's pieces that need no root: the root check's message, the
one-per-machine lock and the OCI image-layout writer."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from localplane import ociimage, realnode


def test_without_root_the_node_refuses_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    with pytest.raises(realnode.RealNodeError, match="the real node needs root"):
        realnode.require_root()


def test_a_second_node_on_the_machine_is_refused_naming_the_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(realnode, "LOCK_FILE", tmp_path / "realnode.lock")

    class _Plane:
        workdir = tmp_path

    first = realnode.RealNode(_Plane(), tmp_path / "first")  # type: ignore[arg-type]
    second = realnode.RealNode(_Plane(), tmp_path / "second")  # type: ignore[arg-type]
    first._acquire_lock()
    try:
        with pytest.raises(realnode.RealNodeError, match=r"already runs.*first"):
            second._acquire_lock()
    finally:
        first._release_lock()
    second._acquire_lock()
    second._release_lock()


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_oci_archive_is_a_consistent_image_layout(tmp_path: Path) -> None:
    binary = tmp_path / "hello"
    binary.write_bytes(b"#!/bin/sh\necho hi\n")
    binary.chmod(0o755)
    layer = ociimage.Layer(files={"/bin/hello": binary}, dirs={"/bin": 0o755})
    layer.symlinks = {"/bin/hi": "hello"}
    out = tmp_path / "img.tar"
    digest = ociimage.write_archive(out, "localhost/test/hello:1", layer, cmd=["/bin/hello"])

    blobs = _members(out)
    assert json.loads(blobs["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    # Every blob is stored under its own digest.
    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(blobs["index.json"])["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/test/hello:1"
    manifest = json.loads(blobs[f"blobs/sha256/{digest[7:]}"])
    config = json.loads(blobs[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["config"]["Cmd"] == ["/bin/hello"]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]

    layer_tar = tmp_path / "layer.tar"
    layer_tar.write_bytes(blobs[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"])
    with tarfile.open(layer_tar) as tar:
        hello = tar.getmember("bin/hello")
        assert hello.mode == 0o755
        assert tar.getmember("bin/hi").linkname == "hello"

    # Deterministic: the same inputs give the same image.
    again = ociimage.write_archive(
        tmp_path / "again.tar", "localhost/test/hello:1", layer, cmd=["/bin/hello"]
    )
    assert again == digest
