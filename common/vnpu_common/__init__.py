"""What the operator and the node agent share, in three rooms, each importing
only from the rooms below it (the `[tool.importlinter]` contracts of pyproject.toml):

- `process`: the plumbing a command runs on: its settings and command line,
  the checks before it starts, logging, the event loop, the garbage
  collector's and the heap's upkeep, and its HTTP port (/metrics, probes).
- `kube`: the Kubernetes plumbing: the API client, raw calls and counted
  writes, paged lists, the informer, the work queue, retries and the faults
  they expect, and the X.509 certificates the webhook and the local plane use.
- `wire`: the contract on the wire, pure data that knows no client and no
  event loop: every name, the API models and the CRDs generated from them,
  quantities, what fits on a chip, Events and patches.

Neither component's package is imported from here, so the agent, the local
plane, the benchmark and the demo depend on this package and never on the
operator's.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vnpu-operator")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
