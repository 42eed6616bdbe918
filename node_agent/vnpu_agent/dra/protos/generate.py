"""Generates the Python modules of the vendored .proto files (see README.md here):
`<dir>/api_pb2.py`, its types `api_pb2.pyi` and `api_pb2_grpc.py`, next to each
`<dir>/api.proto`. Not committed (.gitignore): `make venv` and the Dockerfile run
this, with the grpcio-tools of build-requirements.txt.

    python node_agent/vnpu_agent/dra/protos/generate.py

The include root is `node_agent/`, so the generated modules import each other as
`vnpu_agent.dra.protos...`; the two files are both named api.proto upstream, and
their directories keep them apart (`drahealth/` is upstream's `dra-health/`: a
Python package name has no dash). Messages, services and packages are
upstream's, so the wire names are the kubelet's.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # node_agent/
PROTOS = (
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "drahealth/v1/api.proto",
    "drahealth/v1alpha1/api.proto",
)


def main() -> int:
    from grpc_tools import protoc  # grpcio-tools: a build tool, not a runtime dependency

    include = str(Path(protoc.__file__).parent / "_proto")
    for proto in PROTOS:
        path = (HERE / proto).relative_to(ROOT)
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            str(path),
        ]
        if protoc.main(args) != 0:
            print(f"generate.py: protoc failed on {proto}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
