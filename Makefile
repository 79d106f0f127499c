# Every target bootstraps .venv itself on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup test demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU wheel of torch 2.13.0 lies on this machine's disk; a bare `torch` may pull a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/saegeo run configs/demo.toml

bench: $(STAMP)
	$(BIN)/python benchmarks/geometry_bench.py

clean:
	rm -rf $(VENV) artifacts/acts artifacts/runs
