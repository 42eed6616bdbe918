"""kubectl-vnpu: a read-only kubectl plugin that shows vNPU capacity, where
pods' vNPUs are, why a pod waits and each namespace's use."""
