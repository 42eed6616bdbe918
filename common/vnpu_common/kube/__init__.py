"""The Kubernetes plumbing both components run on: how they call the API
server, read what it holds and retry when it fails. Imports only from `wire`
(see the package's map).

- `lazyclient`: kubernetes-asyncio's API classes and models loaded on first
  use (installed by both components' package `__init__`, before Kopf).
- `apiclient`: the API client, its proxy looked up once and netrc never read.
- `rawcall`: API calls whose answers stay raw JSON, never client models.
- `apiwrites`: every write, counted by the status it answered and fenced by
  leadership up to its first byte (`Writes`, `send_fence`).
- `paging`: the pages of one API list (`limit`/`continue`), restarted on 410.
- `informer`: list-then-watch of one kind as raw JSON, feeding a component's
  caches.
- `workqueue`: the keyed work queue of a controller: one task per key,
  nothing seen while busy lost, failures retried after `backoff`.
- `backoff`: the one retry delay: exponential, capped, with jitter.
- `faults`: which API faults a retry expects, and the one line it logs for one.
- `certs`: X.509 material: a CA, serving and client certificates (the
  webhook's, the local plane's API server and admin user, the metrics port's).
"""
