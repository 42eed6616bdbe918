"""CDI (Container Device Interface) specs, one file per vNPU.

A CDI-aware runtime injects `vnpu.io/vnpu=<id>` into a container from these
files; the Ascend runtime, which reads ASCEND_VISIBLE_DEVICES, does not need
them, so they are written for runtimes that do.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from vnpu_common import names

CDI_VERSION = "0.6.0"
CDI_KIND = f"{names.GROUP}/vnpu"
# Control devices every Ascend container needs next to its vNPU
# (docs/ASCEND.md, 'Device nodes and environment').
_SHARED_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")


def spec_path(cdi_dir: Path, node: str, vnpu_id: int) -> Path:
    # The node is part of the name so that many simulated nodes can share a
    # directory; on a real node it is constant.
    return cdi_dir / f"{names.GROUP}-{node}-vnpu{vnpu_id}.json"


def render(vnpu_id: int, template: str) -> dict[str, Any]:
    nodes = [{"path": f"/dev/davinci{vnpu_id}", "hostPath": names.device_path(vnpu_id)}]
    nodes += [{"path": p} for p in _SHARED_DEVICES]
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


def write(cdi_dir: Path, node: str, vnpu_id: int, template: str) -> Path:
    """Writes atomically, so a runtime never reads half a spec."""
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = spec_path(cdi_dir, node, vnpu_id)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(render(vnpu_id, template), indent=2))
    os.replace(tmp, path)
    return path


def remove(cdi_dir: Path, node: str, vnpu_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        spec_path(cdi_dir, node, vnpu_id).unlink()
