"""The steps of the controller's work queue that write to the cluster for a
pod: PLACE (`place`: book and create its allocations, or wait), PREEMPT
(`preempt`: evict lower-priority pods for a waiting one, and its claim) and
PIN (`pin`: the one patch that starts a pod on its vNPUs). `lifecycle.decide`
names the step; the controller runs it. The rules they apply are pure and
live below: `placement/` (and `placement/preemption.py`, the plan) and
`pinning.py` (the patch)."""
