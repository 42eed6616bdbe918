"""The product image for the real node: built from `Dockerfile` without Docker by
`hack/image/build.sh` (cached by a hash of its inputs), as an OCI image layout
archive that `RealNode.import_image` loads into the node's containerd."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localplane.plane import REPO_ROOT, PlaneError, run_build_script

IMAGE_BUILD_SCRIPT = REPO_ROOT / "hack" / "image" / "build.sh"
NAME_ANNOTATION = "io.containerd.image.name"


class ProductImageError(PlaneError):
    """The image could not be built, or its archive names no image."""


@dataclass(frozen=True)
class ProductImage:
    archive: Path
    # The name containerd gives it on import, e.g. docker.io/library/vnpu-operator:0.1.0-<hash>.
    ref: str

    @property
    def repository(self) -> str:
        return self.ref.rpartition(":")[0]

    @property
    def tag(self) -> str:
        return self.ref.rpartition(":")[2]


def image_ref(archive: Path) -> str:
    """The name an OCI archive carries in its index (what `ctr images import` uses)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ProductImageError(f"{archive} has no index.json")
        index = json.load(member)
    refs = [
        m["annotations"][NAME_ANNOTATION]
        for m in index.get("manifests", [])
        if NAME_ANNOTATION in m.get("annotations", {})
    ]
    if len(refs) != 1:
        raise ProductImageError(f"{archive} names {len(refs)} images, not one: {refs}")
    ref: str = refs[0]
    return ref


def build(progress: Callable[[str], None] = lambda _msg: None) -> ProductImage:
    """Builds the image (or reuses the cached archive); needs root to build."""
    archive = run_build_script(IMAGE_BUILD_SCRIPT, ProductImageError, progress)
    return ProductImage(archive, image_ref(archive))
