"""vnpu-operator: declared ownership of Ascend vNPUs on Kubernetes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vnpu-operator")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
