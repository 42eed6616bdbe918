"""A real Kubernetes control plane on loopback for tests, the demo and benchmarks.

hack/README.md gives each part's make targets; `python -m localplane` runs the
plane by hand.

- `plane`: etcd, kube-apiserver, controller-manager, scheduler and kwok as local
  processes, dying with the test run or outliving it.
- `nodes`: kwok nodes, each with simulated chips declared once, in an annotation.
- `components`: the agent and the operator as real processes, run the same way
  by the tests, the benchmark and the demo.
- `webhookproxy`: one address in front of several operator replicas, as the
  webhook Service is.
- `pods`: pod manifests that ask for vNPUs.
- `waiting`: polling until something holds.
- `policies`: the chart's protection policies rendered for the plane's operator user.
- `pytest_plugin`: the fixtures: one plane per session, a namespace per test.
- `metric_rules`: the naming rules every metric follows, checked on the
  registries and on a scrape.
- `sourceroots`: the source roots, read from pyproject.toml for the Makefile
  and the plane's processes.
- `realnode`: one real node beside the kwok nodes: containerd, runc, CNI and a
  kubelet (the real-node lane).
- `ascend_runtime`: the stand-in for Ascend Docker Runtime the real node runs
  pods with.
- `productimage`: the product image for the real node, built without Docker.
- `ociimage`: a deterministic one-layer OCI archive (the pause and busybox images).
- `chart`: the Helm chart on the plane, with the values that put its pods on
  the real node.
"""

from localplane.nodes import NodeSpec, parse_chips
from localplane.plane import LocalPlane, PlaneError, find_binaries

__all__ = ["LocalPlane", "NodeSpec", "PlaneError", "find_binaries", "parse_chips"]
