"""ResourceClaims of driver vnpu.io: the operator's DRA front-end (docs/DRA.md).

- `claims`: the controller: one reconcile per claim, allocations written
  and booked as an annotated pod's.
- `plan`: what to do for one claim, a pure function of it and its allocations.
- `claimapi`: the claims' reads, and the status entries of our driver applied.
- `pools`: the ResourceSlices of a dead agent's node deleted, so the
  scheduler stops choosing its devices.
"""
