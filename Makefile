# Two commands on a fresh machine: `make lab` and `make test`. Each sets up .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist): one more than the cores, as many tests wait on their child
# processes, servers and leases; 0 runs the suite in this process, one test at a time.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))

.PHONY: lab test soak lint typecheck unit bench bytecode clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,postgres,gateway,nats,otel,ui,langgraph,mcp,agents]'
	touch $(STAMP)

# Bytecode for the sources, written ahead: the lab and the tests start hundreds of Python
# processes, and where PYTHONDONTWRITEBYTECODE is set none of them writes it, so each compiled
# every module it imports again (~0.1 s of CPU per process). Only changed files are recompiled.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 src tests benchmarks

lab: bytecode
	$(BIN)/oncewire lab $(LAB_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck bytecode
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The same suite with the tests marked slow (long soak runs; `make test` runs bounded versions).
soak: lint typecheck bytecode
	$(BIN)/pytest -n $(PYTEST_WORKERS) --soak $(PYTEST_ARGS)

bench: bytecode
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
