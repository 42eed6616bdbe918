"""Dynamic Resource Allocation on a DRA node (docs/DRA.md): the node's
ResourceSlice pool and the kubelet plugin."""
