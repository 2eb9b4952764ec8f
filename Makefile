# Two commands on a fresh machine: `make run` (the demo: SQLite, the local backend) and `make test`.
# The venv is made with the first of python3.13, python3.12, python3.11, python3 that is
# Python >= 3.11; name another with `make PYTHON=/path/to/python3.12 run`.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs torch's CPU build first
# (PyPI's Linux torch wheels bring CUDA).
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3.13 python3.12 python3.11 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; done)
endif
TORCH_INDEX ?=
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run dev lint docs docs-serve screenshots test test-tools test-dates bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || { [ -n "$(PYTHON)" ] && $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))'; } || { \
	  echo "gpu_ops needs Python >= 3.11: PYTHON='$(PYTHON)' is not one (by default the first of python3.13, python3.12, python3.11, python3 that is)." >&2; \
	  echo "Point make at one: make PYTHON=/path/to/python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	@echo "==> [1/3] virtual environment $(VENV) and pip"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "==> [2/3] torch 2.13.0$(if $(TORCH_INDEX), from $(TORCH_INDEX), with the rest)"
	$(if $(TORCH_INDEX),$(PY) -m pip install --progress-bar off torch==2.13.0 --index-url $(TORCH_INDEX))
	@echo "==> [3/3] gpu_ops with its train, test, bench and docs extras (a few minutes on a fresh machine; each package is listed as it comes)"
	set -o pipefail; $(PY) -m pip install --progress-bar off -e '.[train,test,bench,docs]' | { grep --line-buffered -E '^(Collecting|Successfully installed|ERROR)' || true; }
	touch $(STAMP)
	@echo "==> installed: $(VENV)"

venv: $(STAMP)

# The main job: training with an injected preemption, then a month of cost partitions,
# budgets and alerts, on SQLite and the local backend (no cluster, no database server).
run: $(STAMP)
	$(VENV)/bin/gpu-ops demo

# The Dagster UI on the local instance (the top-level dagster.yaml: SQLite under
# .gpu_ops/dagster_home, where `make run` leaves its runs) and the demo's configuration
# (without GPU_OPS_CONFIG the code location uses the plain defaults, not the demo).
# `dg dev` is what Dagster 1.13 runs (`dagster dev` is superseded); the temporary directory
# it announces holds only what dagster.yaml does not place. deploy/dagster.yaml is the
# production instance.
dev: $(STAMP)
	env -u DAGSTER_HOME GPU_OPS_CONFIG=$(CURDIR)/gpu_ops/demo/gpu_ops.yaml $(VENV)/bin/dg dev -w workspace.yaml

# Ruff (with the ban on module-level torch/kubetorch/kubernetes/pandas/SQLAlchemy imports
# in what the code location loads), mypy and import-linter (the layers); `make test` runs it first.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The manual (docs/, mkdocs.yml) in strict mode: a broken link, a missing page or
# reference, a bad snippet path or a griffe warning fails the build. `make test` runs it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# The manual served at http://127.0.0.1:8000, rebuilt when a page changes (`make docs`'s
# build/site/index.html also works opened from disk, without a server).
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

# The manual's pictures (docs/images), taken in headless Chromium (Debian: apt-get install
# chromium): the UI by the screenshot test from a real dagster-webserver, the manual itself
# opened from disk by the docs site test.
screenshots: $(STAMP)
	GPU_OPS_SCREENSHOTS=docs/images $(PY) -m pytest -q gpu_ops_tests/demo/test_screenshots.py gpu_ops_tests/foundation/test_docs_site.py

# What the tests run beside Python, from Debian (as root, or through sudo without a
# password), installed only when missing: `prometheus` (ships promtool; the DCGM and
# observability tests scrape the exporter with it) and `chromium` (the screenshot tests).
# `make test` and `.ci/run` install them the same way.
APT_TOOLS := prometheus:prometheus promtool:prometheus chromium:chromium
test-tools:
	@missing=$$(for t in $(APT_TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || echo $${t#*:}; done | sort -u | tr '\n' ' '); \
	if [ -n "$$missing" ]; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  command -v apt-get >/dev/null 2>&1 || { echo "the tests need $$missing (Debian packages) and there is no apt-get: install them" >&2; exit 1; }; \
	  echo "==> installing $$missing (Debian) for the tests"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# pytest exits 5 when it collected nothing: that is an error, not a pass.
# Three pytest-xdist workers on two cores (a third of a test's wall time is waiting on
# subprocesses, servers and timers: benchmarks/suite.py --workers 2,3); each module's tests
# run on one worker, the longest modules handed out first (gpu_ops_tests/conftest.py,
# LONG_GROUPS). `make test PYTEST_ARGS=`
# runs everything in one process.
PYTEST_ARGS ?= -n 4 --dist loadgroup --durations=25
test: $(STAMP) test-tools lint docs
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

# The modules whose code asks what day it is, run with every process's wall clock moved
# (gpu_ops_tests/conftest.py --clock): a month's last day, the year's last day, 29 February
# and just after midnight on the first of a month. .ci/run runs it after `make test`.
# No plugin is loaded from entry points but xdist's: the clock's sitecustomize imports
# time_machine (a pytest plugin no test uses) before pytest could rewrite it (a warning per run).
DATE_TESTS ?= gpu_ops_tests/alerts gpu_ops_tests/cost/test_budgets.py gpu_ops_tests/cost/test_budget_grains.py \
	gpu_ops_tests/cost/test_window.py gpu_ops_tests/cost/test_schedule_dates.py gpu_ops_tests/cost/test_anomaly.py gpu_ops_tests/training/test_cost_link.py \
	gpu_ops_tests/compute/test_orphans.py gpu_ops_tests/compute/test_resource.py gpu_ops_tests/cost/test_plot_days.py gpu_ops_tests/observability/test_mlflow.py
DATE_CLOCKS ?= 2027-01-31T12:00:00 2027-12-31T12:00:00 2028-02-29T12:00:00 2027-03-01T00:00:20
test-dates: $(STAMP)
	for c in $(DATE_CLOCKS); do echo "==> the date-sensitive tests on $$c UTC"; \
	  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(PY) -m pytest -q -n 2 -p xdist.plugin -p no:cacheprovider --clock $$c $(DATE_TESTS); rc=$$?; \
	  if [ $$rc -ne 0 ]; then echo "the date-sensitive tests failed on $$c (pytest exit $$rc)" >&2; exit 1; fi; done

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .gpu_ops build *.egg-info
