"""A real Kubernetes control plane on loopback for tests, the demo and benchmarks."""

from localplane.nodes import NodeSpec, parse_chips
from localplane.plane import LocalPlane, PlaneError, find_binaries

__all__ = ["LocalPlane", "NodeSpec", "PlaneError", "find_binaries", "parse_chips"]
