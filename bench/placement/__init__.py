"""Placement-quality benchmark: `make bench-placement` / `python -m bench.placement`.

Placement is a pure function over a Ledger, so this needs no control plane:
a long random arrival/departure stream of the scale benchmark's template mix
over a 200-node catalog, run through each policy and through the DRA
scheduler's first fit over the pools the agent publishes (dra.py), plus an
offline best on a small instance (exhaustive search) to know the gap to the
limit.

- `workload`: the cluster and the request streams, the scale benchmark's mix.
- `simulate`: one placement path over one stream: a policy through the
  operator's Ledger, or the DRA scheduler's allocator.
- `dra`: kube-scheduler's allocator replayed over the pools the agent publishes.
- `offline`: the best placement knowing the whole stream, by exhaustive search.
- `churn`: the placement CPU per pod of the scaling run's churn.
- `release`: the placement CPU of the fill's release.
"""
