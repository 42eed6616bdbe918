"""Dynamic Resource Allocation on a DRA node (docs/DRA.md): the node's
ResourceSlice pool and the kubelet plugin.

- `slices`: the node's chips as its pool's ResourceSlices, a pure function.
- `publisher`: that pool written, read back and put back (`PoolPublisher`).
- `served`: a marker per node that served DRA, so only there does an agent
  without `--dra` look for a pool left behind.
- `plugin`: the kubelet plugin's gRPC side: registration and the DRAPlugin
  service, thin adapters.
- `prepare`: what a Prepare and an Unprepare do, without gRPC: a device
  only from a Ready allocation of this node.
- `checkpoint`: which claims are prepared, in two phases, across restarts
  and reboots.
- `metadata`: the KEP-5304 file telling a container which vNPUs its request got.
- `health`: each prepared device's health, streamed to the kubelet.
- `protos/`: the kubelet's gRPC APIs, vendored; the modules are generated.
"""
