"""Placement-quality benchmark: `make bench-placement` / `python -m bench.placement`.

Placement is a pure function over a Ledger, so this needs no control plane:
a long random arrival/departure stream of the scale benchmark's template mix
over a 200-node catalog, run through each policy and through the DRA
scheduler's first fit over the pools the agent publishes (dra.py), plus an
offline best on a small instance (exhaustive search) to know the gap to the
limit."""
