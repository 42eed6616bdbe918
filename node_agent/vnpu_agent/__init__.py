"""vnpu-agent: the per-node agent (creates, health-checks and releases the
vNPUs that allocations declare on its nodes)."""

# Before Kopf or kubernetes-asyncio is imported: their generated API classes
# and models load on first use (vnpu_common.kube.lazyclient, 27 MB of every process).
from vnpu_common.kube import lazyclient

lazyclient.install()
