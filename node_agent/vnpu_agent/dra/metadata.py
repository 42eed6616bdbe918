"""KEP-5304 device metadata: one file per prepared request, telling the
container which vNPUs the request gave it (docs/DRA.md, "What the container
sees").

Layout and format are those of k8s.io/dynamic-resource-allocation v0.37, the
framework Go drivers use (api/metadata/types.go and helpers.go,
kubeletplugin/metadata.go), so that a consumer written against it reads ours:

- in the container, `/var/run/kubernetes.io/dra-device-attributes/` then
  `resourceclaims/<claim name>/` for a claim the pod names, or
  `resourceclaimtemplates/<pod claim name>/` for one made from a template (its
  name is generated; the pod knows the entry's name), then
  `<request>/vnpu.io-metadata.json`;
- on the host, `<dir>/<namespace>_<claim name>_<claim uid>/<request>/metadata.json`;
- the file is a JSON stream holding the same DeviceMetadata once per API
  version, newest first (v1beta1, then v1alpha1 for readers of 1.36).

A subrequest (`<request>/<subrequest>`, prioritized lists) names its base
request in paths and itself in the file, as the framework does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vnpu_agent.dra.checkpoint import ClaimId, PreparedDevice
from vnpu_common.wire import names

log = logging.getLogger(__name__)

HOST_FILE = "metadata.json"
# What the framework gives a metadata file: readable in any container.
FILE_MODE = 0o644


def base_request(request: str) -> str:
    return request.split("/", 1)[0]


def claim_dir(metadata_dir: Path, claim: ClaimId) -> Path:
    # The framework's name, and the UID: a claim deleted and made again under
    # its name may be prepared here while the old one is not yet unprepared.
    return metadata_dir / f"{claim.namespace}_{claim.name}_{claim.uid}"


def host_file(metadata_dir: Path, claim: ClaimId, request: str) -> Path:
    return claim_dir(metadata_dir, claim) / base_request(request) / HOST_FILE


def container_file(claim: ClaimId, pod_claim_name: str | None, request: str) -> str:
    if pod_claim_name:
        where = f"{names.DRA_METADATA_TEMPLATES_SUBDIR}/{pod_claim_name}"
    else:
        where = f"{names.DRA_METADATA_CLAIMS_SUBDIR}/{claim.name}"
    return (
        f"{names.DRA_METADATA_CONTAINER_DIR}/{where}/{base_request(request)}/"
        f"{names.DRA_METADATA_FILE}"
    )


def attributes(device: PreparedDevice, model: str | None) -> dict[str, dict[str, Any]]:
    """The device's attributes, typed as in a ResourceSlice (unqualified names
    are the driver's), in the order Go's encoder writes map keys."""
    attrs: dict[str, dict[str, Any]] = {
        names.DRA_ATTR_VNPU_ID: {"int": device.vnpu_id},
        names.DRA_ATTR_TEMPLATE: {"string": device.template},
    }
    if device.chip >= 0:  # a version 1 checkpoint entry does not know it
        attrs[names.DRA_ATTR_CHIP] = {"int": device.chip}
    if model:
        attrs[names.DRA_ATTR_MODEL] = {"string": model}
    return dict(sorted(attrs.items()))


def document(
    claim: ClaimId,
    pod_claim_name: str | None,
    request: str,
    devices: Iterable[PreparedDevice],
    model: Callable[[int], str | None] = lambda _chip: None,
) -> str:
    """The file's text: one DeviceMetadata per version, as the framework's
    pretty JSON encoder writes them, each ended by a newline."""
    listed = [
        {
            "driver": names.DRA_DRIVER,
            "pool": d.pool,
            "name": d.device,
            "attributes": attributes(d, model(d.chip) if d.chip >= 0 else None),
        }
        for d in sorted(devices, key=lambda d: d.vnpu_id)
    ]
    parts = []
    for api_version in names.DRA_METADATA_API_VERSIONS:
        obj: dict[str, Any] = {
            "kind": names.DRA_METADATA_KIND,
            "apiVersion": api_version,
            "metadata": {
                "name": claim.name,
                "namespace": claim.namespace,
                "uid": claim.uid,
                # Written once at Prepare, never updated (a network driver's
                # later updates are what bump it).
                "generation": 1,
            },
        }
        if pod_claim_name:
            obj["podClaimName"] = pod_claim_name
        obj["requests"] = [{"name": request, "devices": listed}]
        parts.append(json.dumps(obj, indent=2) + "\n")
    return "".join(parts)


def read_objects(text: str) -> list[dict[str, Any]]:
    """The objects of a metadata stream (what the framework's decoder walks)."""
    decoder = json.JSONDecoder()
    objects: list[dict[str, Any]] = []
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return objects
        obj, at = decoder.raw_decode(text, at)
        if not isinstance(obj, dict):
            raise ValueError("a metadata stream holds objects only")
        objects.append(obj)


def recorded_pod_claim_name(path: Path) -> tuple[bool, str | None]:
    """Whether a metadata file we wrote is there to read and, if so, the pod
    claim name it records (None: the claim is one the pod names)."""
    try:
        objects = read_objects(path.read_text())
    except (OSError, ValueError):
        return False, None
    if not objects:
        return False, None
    value = objects[0].get("podClaimName")
    return True, value if isinstance(value, str) and value else None


def write(path: Path, text: str) -> None:
    """Atomically, so a container never reads half a file; a file already as
    it should be is left alone (a retried Prepare rewrites nothing)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text() == text:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, path)


def remove(metadata_dir: Path, claim: ClaimId) -> None:
    """Best effort: a file left behind mounts nowhere once its claim is
    unprepared, while failing the Unprepare would keep the claim's vNPUs held."""
    try:
        shutil.rmtree(claim_dir(metadata_dir, claim))
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("metadata of claim %s not removed: %s", claim, exc)
