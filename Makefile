# gpustack-models: `make run` runs the service locally; `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test quick unit lint bench soak chaos fuzz venv protos controlplane csi-sanity helm versitygw oras manifests clean

venv: $(VENV)/.installed protos

# A fresh clone links .venv to a virtualenv built once per set of pins in a cache outside the repo
# (deploy/python/venv.sh); an existing .venv directory is installed into.
$(VENV)/.installed: requirements.txt requirements-dev.txt deploy/protos/requirements.txt
	@deploy/python/venv.sh $(PYTHON)
	@cat requirements.txt requirements-dev.txt deploy/protos/requirements.txt > $@

# The CSI and kubelet plugin-registration gRPC stubs, compiled from the protos committed in deploy/protos/
# (the stubs are not committed; skipped while the protos' sums are unchanged). The image's build stage runs
# the same script.
protos: $(VENV)/.installed
	@deploy/protos/protos.sh $(PY)

# Builds (or reuses) etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl in a
# cache outside the repo.
controlplane:
	@deploy/controlplane/build.sh >/dev/null

# Builds (or reuses) csi-sanity, the CSI conformance tests, in the same cache.
csi-sanity:
	@deploy/csi-sanity/build.sh >/dev/null

# Builds (or reuses) helm, which lints, renders and installs the chart in the tests, in the same cache.
helm:
	@deploy/helm/build.sh >/dev/null

# Builds (or reuses) versitygw, the S3-compatible server the S3 sources are tested against, in the same cache.
versitygw:
	@deploy/versitygw/build.sh >/dev/null

# Builds (or reuses) oras, the registry client the tests push models with and the benchmarks compare OCI downloads
# with, in the same cache.
oras:
	@deploy/oras/build.sh >/dev/null

run: venv controlplane
	$(PY) manage.py runlocal

# Lint, format, the imports' contracts (pyproject.toml), the Dockerfile, nothing generated out of date
# (migrations, deploy/, the chart's values table docs/values.md), and the committed protos those of the modules
# deploy/controlplane/go.mod pins.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/hadolint Dockerfile
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) manage.py writemanifests --check
	$(PY) manage.py chartvalues --check
	$(PY) deploy/protos/check.py

# The fast tests of pure functions: no control plane, no database server, seconds.
unit: venv
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

# The inner loop: pure functions, the plugin's download engine and the fake hub; no control plane, under a minute.
quick: venv
	$(PY) -m tests.lanes -- tests/unit tests/plugin tests/fakehub -q $(PYTEST_ARGS)

# The whole suite in GPUSTACK_TEST_LANES lanes at once (default 2; tests/lanes.py), lint beside it.
test: venv controlplane csi-sanity helm versitygw oras
	@mkdir -p .local
	@$(MAKE) --no-print-directory lint > .local/lint.log 2>&1 & lint=$$!; \
	$(PY) -m tests.services -- $(PY) -m tests.lanes -- $(PYTEST_ARGS); status=$$?; \
	if wait $$lint; then echo "lint passed (.local/lint.log)"; else cat .local/lint.log; echo "lint failed"; status=1; fi; \
	exit $$status

# Benchmarks at full size, results printed together at the end.
bench: venv controlplane versitygw oras
	GPUSTACK_BENCH=full $(PY) -m tests.services -- $(PY) -m pytest tests/benchmarks -q $(PYTEST_ARGS)

# The soak: 300 watches, 50 progress/s, 20 writes/s and 1,000 informer events/s for 10 minutes; a table of
# latencies and every role's memory slope, and a plot ($(GPUSTACK_SOAK_DIR), default .local/soak).
GPUSTACK_SOAK_DIR ?= $(CURDIR)/.local/soak
soak: venv controlplane
	GPUSTACK_SOAK=full GPUSTACK_SOAK_DIR=$(GPUSTACK_SOAK_DIR) $(PY) -m tests.services -- $(PY) -m pytest tests/soak -q -s $(PYTEST_ARGS)

# The chaos run: every role of the product with its own PostgreSQL and Redis, 50 artifacts across 5 tenants
# downloading, prefetched and mounted, while faults of every kind come one at a time in random order for 20
# minutes (GPUSTACK_CHAOS_SECONDS; GPUSTACK_CHAOS_SEED replays a run); the invariants after every round, a table
# of the rounds and chaos.json ($(GPUSTACK_CHAOS_DIR), default .local/chaos).
GPUSTACK_CHAOS_DIR ?= $(CURDIR)/.local/chaos
chaos: venv controlplane
	GPUSTACK_CHAOS=full GPUSTACK_CHAOS_DIR=$(GPUSTACK_CHAOS_DIR) $(PY) -m tests.services -- $(PY) -m pytest tests/chaos -q -s $(PYTEST_ARGS)

# Generated hostile input against every operation of the API, with a large budget of examples.
GPUSTACK_FUZZ_EXAMPLES ?= 100
fuzz: venv controlplane
	GPUSTACK_FUZZ_EXAMPLES=$(GPUSTACK_FUZZ_EXAMPLES) $(PY) -m tests.services -- $(PY) -m pytest tests/test_api_fuzz.py -q -s $(PYTEST_ARGS)

manifests: venv
	$(PY) manage.py writemanifests
	$(PY) manage.py chartvalues

clean:
	rm -rf .local
