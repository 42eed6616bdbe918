"""vnpu-agent: the per-node agent (creates, health-checks and releases the
vNPUs that allocations declare on its nodes).

Its parts by layer, top to bottom (docs/ARCHITECTURE.md, Layers; `make lint`
holds every module to its layer):

- `main`: the process: one node (DaemonSet) or many simulated ones, one
  shared watch of each kind.
- `check`: `vnpu-agent check`: the node's chips held against the template
  catalog, before anything is installed.
- `node`: one node's agent: `serving`, `publisher` and `driverview` composed,
  the resync and the orphan collection run.
- `watcher`: the label-selected watches of the node's allocations and its
  own VNPUNodes.
- `leases`: every node's Lease renewed, spread over the period.
- `modes`: a node serves one front-end, and is not switched while it holds
  live allocations of the other.
- `serving`: the node's allocations: each vNPU created or adopted, reported,
  destroyed before its finalizer goes.
- `publisher`: the node's VNPUNode status, coalesced, and put back when
  someone else changes it.
- `driverview`: the view of the driver: chips, templates, vNPUs, which are
  ours; every driver call.
- `inventory`: the VNPUNode status an agent publishes.
- `mirror`: what the server holds of the VNPUNode, so a foreign change is
  told from a late event.
- `dra/`: the DRA node's ResourceSlice pool and the kubelet plugin (`--dra`).
- `kubeapi`: every write to the API server, in one place to audit.
- `metrics`: counters, and current state built at scrape time.
- `gc`: orphan collection, decided conservatively.
- `cdi`: CDI specs, one file per vNPU.
- `failpoints`: pauses at named steps, for crash tests only.
- `owned`: the vNPU ids the agent made, on disk, so a restart still knows
  its own.
- `allocation`: one VNPUAllocation's fields, read from the raw object in one
  place.
- `config`: flags and `VNPU_*` variables, checked at start.
- `drivers/`: one interface, three backends; no cluster.
"""

# Before Kopf or kubernetes-asyncio is imported: their generated API classes
# and models load on first use (vnpu_common.kube.lazyclient, 27 MB of every process).
from vnpu_common.kube import lazyclient

lazyclient.install()
