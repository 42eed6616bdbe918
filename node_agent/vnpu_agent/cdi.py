"""CDI (Container Device Interface) specs, one file per vNPU.

A CDI-aware runtime injects `vnpu.io/vnpu=<id>` into a container from these
files when the container's CRI config names that device, which only a device
plugin's Allocate answer, a DRA driver or an NRI plugin does; the product has
none of those (the Ascend runtime, which reads ASCEND_VISIBLE_DEVICES, does
not need the specs), so they are written for a requester of the user's own
(docs/REAL-NODE.md, "CDI specs").

Device nodes carry no type, major or minor: the driver picks the major when
it loads, so the runtime's CDI library stats each `hostPath` at injection
time. A spec therefore injects only on a host where its host paths exist,
which is why their directory is a setting.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from vnpu_common import names

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


def render(vnpu_id: int, template: str, host_device_dir: Path = HOST_DEVICE_DIR) -> dict[str, Any]:
    """The spec of one vNPU: the host's `vdavinci<id>` appears in the
    container as `/dev/davinci<id>` (what the Ascend runtime does), the
    control devices under their own names, all taken from `host_device_dir`."""
    host = Path(names.device_path(vnpu_id)).name
    nodes = [{"path": f"/dev/davinci{vnpu_id}", "hostPath": str(host_device_dir / host)}]
    nodes += [{"path": f"/dev/{d}", "hostPath": str(host_device_dir / d)} for d in SHARED_DEVICES]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": {f"{names.GROUP}/template": template},
        "devices": [
            {
                "name": str(vnpu_id),
                "containerEdits": {
                    "deviceNodes": nodes,
                    "env": [
                        f"{names.ENV_VISIBLE_DEVICES}={vnpu_id}",
                        f"{names.ENV_RUNTIME_OPTIONS}={names.RUNTIME_OPTIONS_VIRTUAL}",
                    ],
                },
            }
        ],
    }


def write(
    cdi_dir: Path,
    node: str,
    vnpu_id: int,
    template: str,
    host_device_dir: Path = HOST_DEVICE_DIR,
) -> Path:
    """Writes atomically, so a runtime never reads half a spec (the CDI
    library reads only `.json` and `.yaml` files, so never the temporary).
    A spec already there as it should be is left alone: every resync ensures
    every vNPU, and rewriting an unchanged file (mkdir, write, rename) was
    most of the agent's file-system time."""
    path = spec_path(cdi_dir, node, vnpu_id)
    # No indent: the C encoder, a fifth of the cost (runtimes read it, not people).
    text = json.dumps(render(vnpu_id, template, host_device_dir))
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


def remove(cdi_dir: Path, node: str, vnpu_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        spec_path(cdi_dir, node, vnpu_id).unlink()
