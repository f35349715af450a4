# The two commands a newcomer needs: `make run` and `make test`. Both set up the venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run test check bench clean

setup: $(STAMP)

# Reinstall whenever the pinned dependencies change.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: setup
	$(BIN)/danube up $(ARGS)

test: setup
	$(BIN)/pytest $(ARGS)

check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy libs tests $(wildcard services/danube/*/)

# Micro-benchmarks that print their numbers (`danube bench` joins once the mesh can serve).
bench: setup
	$(BIN)/pytest -q -s tests/unit/test_frame_throughput.py $(ARGS)
	$(BIN)/python tests/bench/bench_wal.py
	$(BIN)/python tests/bench/bench_ingest.py
	$(BIN)/python tests/bench/bench_dispatch_latency.py
	$(BIN)/python tests/bench/bench_cloud_read.py

clean:
	rm -rf $(VENV) danube-data .mypy_cache .ruff_cache
