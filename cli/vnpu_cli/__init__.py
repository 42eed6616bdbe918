"""kubectl-vnpu: a read-only kubectl plugin that shows vNPU capacity, where
pods' vNPUs are, why a pod waits and each namespace's use.

- `main`: `kubectl vnpu`: the command line and its exit codes.
- `snapshot`: one LIST per kind, and the ledger the operator would build from
  them, so the plugin's answers are the placer's.
- `status`: every node's chips, fragmentation and vNPUs, as the placer sees them.
- `why`: what a pod asks for, what it was told, and where its vNPUs are or
  why each node cannot host it.
- `usage`: per namespace, what its vNPUs take, how many of its pods wait,
  and its quota.
- `defrag`: which pods, rescheduled, would free whole chips; it moves nothing.
- `cordon`: `cordon`/`uncordon NODE CHIP`, the one write, guarded by the
  read's resourceVersion.
- `kube`: the cluster read as kubectl reads it, every failure a sentence.
- `table`: plain text tables as kubectl prints them.
- `errors`: the one error the user is told: a sentence and exit 1.
"""
