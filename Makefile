# Two commands for a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export DPICL_HOME ?= $(CURDIR)/.dpicl
# GPU users: `make TORCH_REQUIREMENTS=requirements/torch-cuda.txt install`
TORCH_REQUIREMENTS ?= requirements/torch-cpu.txt
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

# pip's local mirror config prints one harmless warning per package: drop those lines only.
QUIET := 2> >(grep -v "is ignored: it is neither" >&2)

$(STAMP): pyproject.toml requirements/*.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r $(TORCH_REQUIREMENTS) $(QUIET)
	$(PIP) install -q -r requirements/base.txt $(QUIET)
	$(PIP) install -q --no-deps --require-hashes -r requirements/embedded.txt $(QUIET)
	$(PIP) install -q --no-deps --no-build-isolation -e . $(QUIET)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dpicl demo

# One worker more than the 2-core machine has: tests wait on subprocesses and the Prefect server part of their
# time, and a third worker computes meanwhile (benchmarks/RESULTS.md, the test suite).
TEST_WORKERS ?= 3

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --timeout=1500 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/bench_accounting.py
	$(PY) benchmarks/bench_generation.py
	$(PY) benchmarks/bench_icl.py

clean:
	rm -rf $(VENV) .dpicl
