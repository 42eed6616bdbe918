"""What the operator and the node agent share: the wire contract (names, API
models, CRD generation, raw API calls, Events, finalizer patches) and the
plumbing both run on (work queue, backoff, settings and logging).

Neither component's package is imported from here, so the agent, the local
plane, the benchmark and the demo depend on this package and never on the
operator's.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vnpu-operator")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
