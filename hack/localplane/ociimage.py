"""A minimal OCI image-layout writer: one layer, one manifest, one config, as a
tar archive that `ctr images import` reads. No registry and no Docker exist on
the real node's machine, so the pause (sandbox) image and the tests' busybox
image are written here from single static binaries.

The archive is deterministic (fixed mtimes, owners and order), so the same
inputs give the same digests and a re-import is a no-op for containerd.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
# Uncompressed: the layer's digest is then its diff_id, and the images are a
# few MiB that never leave the machine.
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"

_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def goarch() -> str:
    """This machine's architecture as OCI (Go) names it."""
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


@dataclass
class Layer:
    """The files of one layer: regular files (copied from the host, with their
    mode), symlinks and directories. Parents must be listed as directories."""

    files: dict[str, Path] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path, mode in sorted(self.dirs.items()):
                info = tarfile.TarInfo(path.strip("/"))
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
            for path, src in sorted(self.files.items()):
                data = src.read_bytes()
                info = tarfile.TarInfo(path.strip("/"))
                info.size, info.mode = len(data), src.stat().st_mode & 0o7777
                tar.addfile(info, io.BytesIO(data))
            for path, target in sorted(self.symlinks.items()):
                info = tarfile.TarInfo(path.strip("/"))
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                tar.addfile(info)
        return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_archive(
    out: Path,
    name: str,
    layer: Layer,
    *,
    entrypoint: Sequence[str] = (),
    cmd: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    arch: str | None = None,
) -> str:
    """Writes an OCI image-layout tar for image `name` (`repo:tag`; containerd
    takes the name from the `io.containerd.image.name` annotation) to `out` and
    returns the manifest digest. `arch`: the config's architecture (this machine's)."""
    layer_tar = layer.tar()
    layer_digest = _digest(layer_tar)
    arch = arch or goarch()
    config: dict[str, Any] = {
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": [f"{k}={v}" for k, v in (env or {"PATH": "/bin"}).items()],
            "Entrypoint": list(entrypoint) or None,
            "Cmd": list(cmd) or None,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_json = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": _digest(config_json),
            "size": len(config_json),
        },
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer_digest, "size": len(layer_tar)}],
    }
    manifest_json = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = _digest(manifest_json)
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": manifest_digest,
                "size": len(manifest_json),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        f"blobs/sha256/{layer_digest[7:]}": layer_tar,
        f"blobs/sha256/{_digest(config_json)[7:]}": config_json,
        f"blobs/sha256/{manifest_digest[7:]}": manifest_json,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return manifest_digest


def pause_layer(pause: Path) -> Layer:
    """The sandbox image: the static pause binary alone."""
    return Layer(files={"/pause": pause})


def busybox_layer(busybox: Path) -> Layer:
    """A shell and the usual tools: static busybox with a link per applet."""
    applets = subprocess.run(
        [str(busybox), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    layer = Layer(
        files={"/bin/busybox": busybox},
        dirs={d: 0o755 for d in ("/bin", "/dev", "/etc", "/proc", "/sys", "/var")},
    )
    layer.dirs["/tmp"] = 0o1777
    layer.symlinks = {f"/bin/{a}": "busybox" for a in applets if a != "busybox"}
    return layer
