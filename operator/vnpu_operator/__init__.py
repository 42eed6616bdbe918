"""vnpu-operator: declared ownership of Ascend vNPUs on Kubernetes (the
cluster operator: admission, placement, the allocation lifecycle)."""
