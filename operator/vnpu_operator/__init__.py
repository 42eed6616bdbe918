"""vnpu-operator: declared ownership of Ascend vNPUs on Kubernetes (the
cluster operator: admission, placement, the allocation lifecycle)."""

# Before Kopf or kubernetes-asyncio is imported: their generated API classes
# and models load on first use (vnpu_common.kube.lazyclient, 27 MB of every process).
from vnpu_common.kube import lazyclient

lazyclient.install()
