# vnpu-operator: every command a developer or CI needs.
#   make demo   local control plane + simulated NPUs + operator/agents + sample pods
#   make test   lint, type checks, unit, integration, end-to-end and real-node tests
#   make demo-node  the story on a real kubelet + containerd node (root)
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The source roots, read from pyproject.toml's [tool.pytest.ini_options] pythonpath (the
# one place they are defined; hack/README.md): for the commands below that pytest does not run.
PYPATH = $(shell $(PY) hack/localplane/sourceroots.py)

.PHONY: help
help: ## list targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

# The DRA plugin's gRPC modules, generated from the vendored .proto files (not committed;
# node_agent/vnpu_agent/dra/protos/README.md). The Dockerfile runs the same script.
PROTO_DIR := node_agent/vnpu_agent/dra/protos
PROTOS := $(PROTO_DIR)/pluginregistration/v1/api.proto $(PROTO_DIR)/dra/v1/api.proto \
	$(PROTO_DIR)/drahealth/v1/api.proto $(PROTO_DIR)/drahealth/v1alpha1/api.proto

# Exactly the locked set (make lock): the lock's pip and build backend, the tested
# dependencies, then the project itself with nothing more; then the generated stubs.
$(STAMP): pyproject.toml pylock.dev.toml build-requirements.txt $(PROTOS) $(PROTO_DIR)/generate.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (found %s); set PYTHON=python3.11" % sys.version.split()[0])'
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r build-requirements.txt
	$(PY) -m pip install -q -r pylock.dev.toml
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) $(PROTO_DIR)/generate.py
	@touch $@

.PHONY: venv
venv: $(STAMP) ## create .venv with the project and its dev tools

.PHONY: lock
lock: $(STAMP) ## re-resolve the lock files from pyproject.toml, keeping other pins (UPGRADE=1: newest)
	bash hack/lock.sh $(if $(UPGRADE),--upgrade)

.PHONY: plane
plane: ## build (or reuse) the control-plane binaries from Go modules, both Kubernetes lanes (hack/plane/versions.env)
	@bash hack/plane/build.sh --all >/dev/null

# The main lane alone: what the demos, the benchmarks and the real node need.
.PHONY: plane-main
plane-main:
	@bash hack/plane/build.sh >/dev/null

.PHONY: node-tools
node-tools: ## build (or reuse) the real node's kubelet, containerd, runc, CNI plugins and pause
	@bash hack/node/build.sh >/dev/null

.PHONY: image
image: ## build (or reuse) the product image from Dockerfile without Docker (root); prints its OCI archive
	@PYTHON=$(PYTHON) bash hack/image/build.sh

# The release's and the checks' Go tools (hack/tools/versions.env), built before the tests
# that run them, so that a cold build (minutes) is not counted against a test's timeout:
# cosign and syft (the release), helm v4 (tests/integration/test_chart_helm4.py).
.PHONY: release-tools
release-tools:
	@bash hack/tools/build.sh cosign >/dev/null
	@bash hack/tools/build.sh syft >/dev/null
	@bash hack/tools/build.sh helm4 >/dev/null

# The check tools: promtool, which tests/integration/test_alert_rules.py runs on the chart's
# alerts (tests/alerts). Built before the tests for the same reason.
.PHONY: check-tools
check-tools:
	@bash hack/tools/build.sh promtool >/dev/null

.PHONY: release
release: $(STAMP) plane-main release-tools ## versioned artifacts from a clean tree into dist/<version>/: chart, images (amd64, arm64), SBOMs, SHA256SUMS, signatures (root; docs/RELEASING.md)
	PYTHON=$(abspath $(PY)) PYTHONPATH=$(PYPATH) $(PY) -m release

.PHONY: crds
crds: $(STAMP) ## regenerate crds/ and the chart's copy from the API models
	$(PY) -m vnpu_common.wire.crdgen crds/ charts/vnpu-operator/files/crds/

.PHONY: chart-docs
chart-docs: $(STAMP) ## regenerate charts/vnpu-operator/README.md from its values and schema
	PYTHONPATH=$(PYPATH) $(PY) -m chartdocs charts/vnpu-operator

.PHONY: lint
lint: $(STAMP) ## ruff, the import contracts of pyproject.toml (import-linter), mypy_path against the source roots
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PYTHONPATH=$(PYPATH) $(VENV)/bin/lint-imports --no-logo --no-cache
	$(PY) hack/localplane/sourceroots.py --check

.PHONY: fmt
fmt: $(STAMP) ## format and autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: typecheck
typecheck: $(STAMP) ## mypy (strict)
	$(VENV)/bin/mypy

.PHONY: test
test: $(STAMP) plane release-tools check-tools lint typecheck ## everything CI runs (root: the real-node lane; bench-quick last: correctness only)
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-k8s134
	$(MAKE) --no-print-directory test-realnode
	$(MAKE) --no-print-directory bench-quick

.PHONY: test-unit
test-unit: $(STAMP) ## unit tests only (no control plane)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

.PHONY: test-k8s134
test-k8s134: $(STAMP) plane ## the tests marked k8s134 (policies, quota, gates, webhooks) again, on the Kubernetes 1.34 lane
	$(PY) -m pytest -m k8s134 --k8s-lane 1.34 tests/integration $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: $(STAMP) plane-main ## the end-to-end test alone: the demo's story, checked, on a plane of its own (about a minute)
	$(PY) -m pytest -m e2e e2e $(PYTEST_ARGS)

.PHONY: test-realnode
test-realnode: $(STAMP) plane-main node-tools image release-tools ## the real-node lane alone (root; a kubelet + containerd node on the local plane)
	$(PY) -m pytest -m realnode tests/integration $(PYTEST_ARGS)

.PHONY: demo
demo: $(STAMP) plane-main ## the whole story on a local plane
	PYTHONPATH=$(PYPATH) $(PY) e2e/demo.py

.PHONY: demo-dra
demo-dra: $(STAMP) plane-main ## the claim story (DRA, ResourceClaims) on a local plane
	PYTHONPATH=$(PYPATH) $(PY) e2e/demo_dra.py

.PHONY: demo-node
demo-node: $(STAMP) plane-main node-tools image ## the story on a real node (root): chart, product image, kubectl exec into containers with vNPUs
	PYTHONPATH=$(PYPATH) $(PY) e2e/demo_node.py

.PHONY: bench
bench: $(STAMP) plane-main ## scale benchmark with the floors: 200 nodes, 1000 pods at 10/s (about 11 min on 2 cores; bench/results.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench --nodes 200 --pods 1000 --rate 10 --out bench/results.json

.PHONY: bench-10pps
bench-10pps: $(STAMP) plane-main ## the same 200-node churn without the floors (about 6 min; bench/results-10pps.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench --nodes 200 --pods 1000 --rate 10 --no-floors --no-floor-replay --out bench/results-10pps.json

.PHONY: bench-pyspy
bench-pyspy: $(STAMP) plane-main ## the 200-node churn without the floors, py-spy sampling where the CPU goes (about 6 min; bench/results-pyspy.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench --nodes 200 --pods 1000 --rate 10 --no-floors --no-floor-replay --pyspy --out bench/results-pyspy.json

.PHONY: bench-rate
bench-rate: $(STAMP) plane-main ## floors and the sustainable rate (p99 ungated <= 1 s), ours vs plain pods, 20 nodes (minutes)
	PYTHONPATH=$(PYPATH) $(PY) -m bench --nodes 20 --pods 600 --rate 20 --rate-search --rate-search-budget 150 --out bench/results-20n-floors.json

.PHONY: bench-1000
bench-1000: $(STAMP) plane-main ## 1000 nodes x 8 chips, 4 agent processes, 1000 pods at 10/s, with the logic-free replay (about 17 min on 2 cores; bench/results-1000.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench --nodes 1000 --agents 4 --pods 1000 --rate 10 --idle 20 --timeout 600 --no-floors --out bench/results-1000.json

.PHONY: bench-1000-release
bench-1000-release: $(STAMP) plane-main ## 1000 nodes, the fill's 100 freed pods deleted at 10/s (the rate 2 cores sustain) rather than at once: freed -> placed (about 11 min; bench/results-1000-release.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench --nodes 1000 --agents 4 --pods 100 --rate 10 --release-rate 10 --idle 5 --timeout 600 --no-floors --no-floor-replay --out bench/results-1000-release.json

.PHONY: bench-scale
bench-scale: $(STAMP) plane-main ## operator and agent costs at 250, 500, 1000 and 2000 kwok nodes, 300 pods at 5/s each (bench/results-scale.json; most of an hour on 2 cores)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.scale --out bench/results-scale.json

.PHONY: bench-dra
bench-dra: $(STAMP) plane-main ## claim pods beside annotation and plain pods at one rate: 20 DRA + 20 annotation nodes, 300 pods of each kind at 3/s (about 3 min on 2 cores; bench/results-dra.json; other sizes: python -m bench.dra --nodes/--pods/--rate)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.dra --nodes 20 --pods 300 --rate 3 --out bench/results-dra.json

.PHONY: bench-placement
bench-placement: $(STAMP) ## placement quality per policy: 200 nodes, no control plane (bench/results-placement.json; minutes on 2 cores)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.placement --out bench/results-placement.json

.PHONY: bench-policies
bench-policies: $(STAMP) plane-main ## API server CPU per plain pod with and without the protection policies, 20 nodes (bench/results-policies.json; minutes)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.policycost --out bench/results-policies.json

.PHONY: bench-writecost
bench-writecost: $(STAMP) plane-main ## API server CPU per VNPUNode status write, templates per chip, per model and none (about 2 min; bench/results-writecost.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.writecost --out bench/results-writecost.json

.PHONY: bench-agentnode
bench-agentnode: $(STAMP) ## one agent at an empty and a full node (8 chips, each template mix): CPU per resync, status write, allocation event; no control plane (seconds; bench/results-agentnode.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.agentnode --out bench/results-agentnode.json

.PHONY: bench-failover
bench-failover: $(STAMP) plane-main ## HA: 10 leader SIGKILLs in a 200-pod churn, 200 nodes, default lease (4 s; about 7 min on 2 cores; bench/results-failover.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.failover --nodes 200 --agents 4 --pods 200 --rate 1.0 --hold 30 --kills 10 --workdir /tmp/vnpu-bench-failover4 --out bench/results-failover.json

.PHONY: bench-failover-lease15
bench-failover-lease15: $(STAMP) plane-main ## HA with client-go's lease (15 s, 10 s, 2 s), beside one replica's restart (the tree before issue 35): 10 leader SIGKILLs in a 200-pod churn, 200 nodes (about 12 min; bench/results-failover-lease15.json)
	rm -rf /tmp/vnpu-before-ha && mkdir -p /tmp/vnpu-before-ha
	git archive db75fa2^ common operator node_agent cli hack pyproject.toml | tar -x -C /tmp/vnpu-before-ha
	PYTHONPATH=$(PYPATH) $(PY) -m bench.failover --nodes 200 --agents 4 --pods 200 --rate 0.6 --hold 40 --kills 10 --lease 15 --deadline 10 --retry 2 --before /tmp/vnpu-before-ha --out bench/results-failover-lease15.json

.PHONY: bench-shared
bench-shared: $(STAMP) plane-main ## the shared cluster: 2000 live vNPU pods on 200 nodes among 4000 ordinary pods on 20; a 240-pod vNPU churn alone, then beside ordinary pods replaced at 10/s; cold start and failover at 2000 live pods (about 10 min on 2 cores, estimated from a 20-node run; bench/results-shared.json; `python -m bench.shared --large`: 1000 nodes, 10000 and 20000 pods, for 16 cores)
	PYTHONPATH=$(PYPATH) $(PY) -m bench.shared --out bench/results-shared.json

.PHONY: bench-quick
bench-quick: $(STAMP) plane-main ## small benchmark (20 nodes, 200 pods); fails on a correctness counter
	PYTHONPATH=$(PYPATH) $(PY) -m bench --quick

.PHONY: bench-quick-floors
bench-quick-floors: $(STAMP) plane-main ## the small benchmark with the floors: CPU per pod, latencies (about 3 min; bench/results-quick-floors.json)
	PYTHONPATH=$(PYPATH) $(PY) -m bench --quick --floors --out bench/results-quick-floors.json

.PHONY: cluster-up
cluster-up: $(STAMP) plane-main ## start a local plane in .localplane/ and print KUBECONFIG
	@PYTHONPATH=$(PYPATH) $(PY) -m localplane up --crds crds

.PHONY: cluster-down
cluster-down: $(STAMP) ## stop the plane started by cluster-up
	@PYTHONPATH=$(PYPATH) $(PY) -m localplane down

.PHONY: clean
clean: cluster-down ## remove local state (keeps the binary cache)
	rm -rf .localplane .mypy_cache .ruff_cache .pytest_cache
