"""CDI (Container Device Interface) specs, one file per vNPU.

A CDI-aware runtime injects `vnpu.io/vnpu=<id>` into a container from these
files when the container's CRI config names that device, which only a device
plugin's Allocate answer, a DRA driver or an NRI plugin does; the product has
none of those (the Ascend runtime, which reads ASCEND_VISIBLE_DEVICES, does
not need the specs), so they are written for a requester of the user's own
(docs/REAL-NODE.md, "CDI specs"). On a DRA node the kubelet plugin writes a
spec of its own per prepared claim device (kind `vnpu.io/claim`, below), and
the kubelet names those to the runtime (docs/DRA.md, "The kubelet plugin").

Device nodes carry no type, major or minor: the driver picks the major when
it loads, so the runtime's CDI library stats each `hostPath` at injection
time. A spec therefore injects only on a host where its host paths exist,
which is why their directory is a setting.

A claim's specs also carry what the container needs to know its vNPUs
(docs/DRA.md, "What the container sees"): the env of the request a device
serves and the mount of that request's KEP-5304 metadata file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vnpu_common.wire import names

# 0.6.0 is the first version with spec annotations; device names that start
# with a digit and hostPath need 0.5.0 (the CDI library refuses a spec whose
# version is older than the features it uses).
CDI_VERSION = "0.6.0"
CDI_KIND = f"{names.GROUP}/vnpu"
# Where the Ascend driver makes its device nodes on a host.
HOST_DEVICE_DIR = Path("/dev")
# Control devices every Ascend container needs next to its vNPU
# (docs/ASCEND.md, 'Device nodes and environment'); same name on the host and
# in the container.
SHARED_DEVICES = ("davinci_manager", "devmm_svm", "hisi_hdc")


def spec_path(cdi_dir: Path, node: str, vnpu_id: int) -> Path:
    # The node is part of the name so that many simulated nodes can share a
    # directory; on a real node it is constant. (A runtime must not read such
    # a shared directory: two specs naming the same `vnpu.io/vnpu=<id>` are a
    # conflict to the CDI library, which then offers neither.)
    return cdi_dir / f"{names.GROUP}-{node}-vnpu{vnpu_id}.json"


def device_name(vnpu_id: int) -> str:
    """The fully qualified CDI name a requester puts in the container's config."""
    return f"{CDI_KIND}={vnpu_id}"


def _device(name: str, vnpu_id: int, host_device_dir: Path, env: list[str]) -> dict[str, Any]:
    """One CDI device giving a container the vNPU `vnpu_id`: the host's
    `vdavinci<id>` appears in the container as `/dev/davinci<id>` (what the
    Ascend runtime does), the control devices under their own names, all
    taken from `host_device_dir`."""
    host = Path(names.device_path(vnpu_id)).name
    nodes = [{"path": f"/dev/davinci{vnpu_id}", "hostPath": str(host_device_dir / host)}]
    nodes += [{"path": f"/dev/{d}", "hostPath": str(host_device_dir / d)} for d in SHARED_DEVICES]
    return {"name": name, "containerEdits": {"deviceNodes": nodes, "env": env}}


def render(vnpu_id: int, template: str, host_device_dir: Path = HOST_DEVICE_DIR) -> dict[str, Any]:
    """The spec of one vNPU, device `vnpu.io/vnpu=<id>` (see _device). Its env
    names this vNPU alone and no device index: a requester may name several of
    these for one container, and the CDI library keeps one value per variable
    (the last device's), so an index list here would hide the others."""
    env = [
        f"{names.ENV_VISIBLE_DEVICES}={vnpu_id}",
        f"{names.ENV_RUNTIME_OPTIONS}={names.RUNTIME_OPTIONS_VIRTUAL}",
    ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": {f"{names.GROUP}/template": template},
        "devices": [_device(str(vnpu_id), vnpu_id, host_device_dir, env)],
    }


def _write_atomic(cdi_dir: Path, path: Path, spec: dict[str, Any]) -> Path:
    """Writes atomically, so a runtime never reads half a spec (the CDI
    library reads only `.json` and `.yaml` files, so never the temporary).
    A spec already there as it should be is left alone: every resync ensures
    every vNPU, and rewriting an unchanged file (mkdir, write, rename) was
    most of the agent's file-system time."""
    # No indent: the C encoder, a fifth of the cost (runtimes read it, not people).
    text = json.dumps(spec)
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text() == text:
            return path
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
    except FileNotFoundError:  # the first spec (or someone removed the directory)
        cdi_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write(
    cdi_dir: Path,
    node: str,
    vnpu_id: int,
    template: str,
    host_device_dir: Path = HOST_DEVICE_DIR,
) -> Path:
    """The spec of one vNPU, written atomically (_write_atomic)."""
    path = spec_path(cdi_dir, node, vnpu_id)
    return _write_atomic(cdi_dir, path, render(vnpu_id, template, host_device_dir))


def remove(cdi_dir: Path, node: str, vnpu_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        spec_path(cdi_dir, node, vnpu_id).unlink()


# -- DRA: one spec per prepared device of a claim (vnpu_agent/dra/prepare.py) --------
#
# Named after the claim's UID and the device, never after the vNPU id alone: a
# runtime caches CDI devices by name, and a new claim must not be handed a name
# an old one had (docs/DRA.md, "The kubelet plugin").


def claim_device(claim_uid: str, device: str) -> str:
    """The CDI device name of one prepared device of a claim."""
    return f"{claim_uid}-{device}"


def claim_device_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI id the kubelet hands the runtime, e.g.
    `vnpu.io/claim=<claim uid>-npu-0-vir05-1c-16g-0`."""
    return f"{names.DRA_CDI_KIND}={claim_device(claim_uid, device)}"


def claim_spec_path(cdi_dir: Path, claim_uid: str, device: str) -> Path:
    return cdi_dir / f"{names.GROUP}-claim-{claim_device(claim_uid, device)}.json"


def claim_env(request_ids: Iterable[int]) -> list[str]:
    """The env of every device of one request: the request's vNPUs, and CANN's
    indexes of them. The CDI library keeps one value per variable, the last
    device's, so each device of a request carries the same values: a
    container that takes one request gets them whatever the device order.

    ASCEND_VISIBLE_DEVICES and VIRTUAL are what the Ascend runtime reads (it
    mounts what CDI already did, and its hook mounts the driver's libraries
    only when the list is not empty); ASCEND_VNPU_SPECS empty keeps an image's
    value from making the runtime create a vNPU of its own; and
    ASCEND_RT_VISIBLE_DEVICES replaces any the image or the pod brought:
    CANN reads it as indexes 0..n-1 over the container's devices in ascending
    id, and a vNPU id there (116) names no device at all."""
    ids = sorted(set(request_ids))
    return [
        f"{names.ENV_VISIBLE_DEVICES}={','.join(str(i) for i in ids)}",
        f"{names.ENV_RUNTIME_OPTIONS}={names.RUNTIME_OPTIONS_VIRTUAL}",
        f"{names.ENV_VNPU_SPECS}=",
        f"{names.ENV_RT_VISIBLE_DEVICES}={names.device_indexes(len(ids))}",
    ]


def metadata_mount(host_file: Path, container_file: str) -> dict[str, Any]:
    """A request's KEP-5304 metadata file, read-only where the container looks
    for it (the mount k8s.io/dynamic-resource-allocation v0.37's kubeletplugin
    writes, metadata.go writeCDISpec). Every device of the request carries it:
    the CDI library keeps one mount per container path, so a container
    gets it once, whichever of the request's devices it is given first."""
    return {"hostPath": str(host_file), "containerPath": container_file,
            "options": ["ro", "bind"]}  # fmt: skip


def render_claim(
    claim_uid: str,
    device: str,
    vnpu_id: int,
    template: str,
    host_device_dir: Path = HOST_DEVICE_DIR,
    request_ids: Iterable[int] = (),
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The spec of one prepared claim device: kind `vnpu.io/claim`, the same
    device nodes as the vNPU's own spec (render), the env of its request
    (claim_env; `request_ids`: the request's vNPUs, this one at least) and
    the mount of its request's metadata file (metadata_mount), if any."""
    edits = _device(claim_device(claim_uid, device), vnpu_id, host_device_dir,
                    claim_env([vnpu_id, *request_ids]))  # fmt: skip
    if metadata is not None:
        edits["containerEdits"]["mounts"] = [metadata]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": names.DRA_CDI_KIND,
        "annotations": {
            f"{names.GROUP}/template": template,
            f"{names.GROUP}/claim-uid": claim_uid,
        },
        "devices": [edits],
    }


def write_claim(
    cdi_dir: Path,
    claim_uid: str,
    device: str,
    vnpu_id: int,
    template: str,
    host_device_dir: Path = HOST_DEVICE_DIR,
    request_ids: Iterable[int] = (),
    metadata: dict[str, Any] | None = None,
) -> Path:
    path = claim_spec_path(cdi_dir, claim_uid, device)
    spec = render_claim(
        claim_uid, device, vnpu_id, template, host_device_dir, request_ids, metadata
    )
    return _write_atomic(cdi_dir, path, spec)


def remove_claim(cdi_dir: Path, claim_uid: str, device: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        claim_spec_path(cdi_dir, claim_uid, device).unlink()
