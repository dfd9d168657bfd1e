# Two commands on a fresh machine: `make lab` and `make test`. Each sets up .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist); 0 runs the suite in this process, one test at a time.
PYTEST_WORKERS ?= 2

.PHONY: lab test soak lint typecheck unit bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,postgres,gateway,nats,otel,ui]'
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/oncewire lab $(LAB_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The same suite with the tests marked slow (long soak runs; `make test` runs bounded versions).
soak: lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) --soak $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
