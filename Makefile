# gpustack-models: `make run` runs the service locally; `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test bench venv controlplane manifests clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	@cp requirements.txt $@

# Builds (or reuses) etcd, kube-apiserver, kube-controller-manager and kubectl in a cache outside the repo.
controlplane:
	@deploy/controlplane/build.sh >/dev/null

run: venv controlplane
	$(PY) manage.py runlocal

test: venv controlplane
	$(PY) -m tests.services -- $(PY) -m pytest $(PYTEST_ARGS)

# Benchmarks at full size, results printed together at the end.
bench: venv controlplane
	GPUSTACK_BENCH=full $(PY) -m tests.services -- $(PY) -m pytest tests/benchmarks -q $(PYTEST_ARGS)

manifests: venv
	$(PY) manage.py writemanifests

clean:
	rm -rf .local
