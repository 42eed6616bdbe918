"""Scale benchmark: `make bench` / `make bench-quick` (see bench/run.py).

Imports `localplane` from hack/: the make targets put the source roots on PYTHONPATH
(hack/README.md); by hand, from the repository root, `PYTHONPATH=hack .venv/bin/python -m
bench ...` (the venv's editable install provides the product's packages).
"""
