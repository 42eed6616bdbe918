"""vnpu-operator: declared ownership of Ascend vNPUs on Kubernetes (the
cluster operator: admission, placement, the allocation lifecycle).

Its parts by layer, top to bottom (docs/ARCHITECTURE.md, Layers; `make lint`
holds every module to its layer):

- `main`: the process: the probes and metrics server, the webhook, Kopf.
- `pod_security`: the chart's install hook: the namespace's Pod Security
  labels, then a dry run proving the agent's pods are admitted.
- `wiring`: the composition root: every part built and connected (`Parts`).
- `handlers`: Kopf's side: startup, cleanup, login, ResourceQuotas.
- `watches`: the informers of pods, allocations, VNPUNodes and Nodes, since
  Kopf's per-event machinery cost more than the handling.
- `convergence`: a deletion a broken watch lost still leaves the caches.
- `leader`: the leader election's runner, and the fence every write asks.
- `controller`: the caches, and one reconcile per pod through `lifecycle.decide`.
- `dra/`: ResourceClaims of driver vnpu.io, booked in the same ledger.
- `steps/`: PLACE, PREEMPT and PIN: what the reconcile writes for a pod.
- `waiting`: the waiting line: pods with no room, oldest first, retried when
  capacity may have grown.
- `advertise`: each node's vNPU totals as Node extended resources, so the
  scheduler's sum admits what the ledger placed.
- `inventories`: a node as the ledger books against it, from its VNPUNode,
  Node and agent Lease.
- `notices`: Events and the vnpu.io/Allocated condition, each said once.
- `admission/`: the webhooks: the verdicts, the app, TLS and registration.
- `kubeapi`: every write to the API server, in one place to audit.
- `metrics`: counters, and current state built at scrape time, so nothing
  gone leaves a series.
- `config`: flags and `VNPU_*` variables, checked at start.
- `leases`: agent Leases, watched and turned into whether a node is live.
- `podstate`: what is remembered of a pod between reconciles, and the
  writes not yet seen come back.
- `leaving`: pods kube-scheduler still counts on a node after the ledger
  freed them.
- `timers`: pods reconciled again after a delay no event marks.
- `placement/`: the ledger: node, chips and vNPU ids, decided and booked in
  one synchronous call (pure).
- `lifecycle`: a pod's next step, a pure function of the pod and its
  allocations, so a restart resumes from the objects.
- `pinning`: the one patch that starts a pod on its vNPUs.
- `election`: the leader election's rules, tested with plain numbers.
- `takeover`: what a replica that starts reconciling releases, namespace by
  namespace, before it places anything new.
- `annotations`: the vnpu.io pod annotations, read one way by the webhook
  and the placer.
- `slim`: the copies of API objects the caches keep: only what is read.
"""

# Before Kopf or kubernetes-asyncio is imported: their generated API classes
# and models load on first use (vnpu_common.kube.lazyclient, 27 MB of every process).
from vnpu_common.kube import lazyclient

lazyclient.install()
