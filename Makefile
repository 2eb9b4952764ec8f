# Two commands on a fresh machine: `make run` (the demo on the embedded default) and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run dev test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,test]'
	touch $(STAMP)

venv: $(STAMP)

# The main job: training with an injected preemption, then a month of cost partitions,
# budgets and alerts, on SQLite and the local backend (no cluster, no database server).
run: $(STAMP)
	$(VENV)/bin/gpu-ops demo

# The Dagster UI on a local instance of its own: the top-level dagster.yaml is the
# production instance (PostgreSQL, K8sRunLauncher) and is not used here.
dev: $(STAMP)
	mkdir -p .gpu_ops/dagster_home
	DAGSTER_HOME=$(CURDIR)/.gpu_ops/dagster_home $(VENV)/bin/dagster dev -w workspace.yaml

# pytest exits 5 when it collected nothing: that is an error, not a pass.
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .gpu_ops build *.egg-info
