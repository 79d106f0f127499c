#!/usr/bin/env bash
# GPU checks in under 10 minutes, one line each and one table: cache GPU vs CPU, TopK training tokens/s GPU vs CPU,
# every architecture, bf16 throughput at d 2,304 x 16k vs the FLOP bound, the accumulation vs the bare gram,
# SmolLM2-shaped caching, a report on the GPU, the GeometryAccumulator past its row sample on the GPU vs CPU,
# saegeo eval on the GPU vs CPU, torchrun --nproc_per_node 1 with NCCL (benchmarks/gpu_check.py does the work), then the width-262k dictionary
# check on the GPU (benchmarks/gpu_width_check.py).
#
#   benchmarks/gpu_check.sh --prepare      here, with pip and the project venv: fill artifacts/gpu_carry/ with
#                                          the pure-Python wheels the GPU machine lacks and MiniLM's tokenizer
#   benchmarks/gpu_check.sh                on the GPU machine (its own Python with CUDA torch, transformers,
#                                          safetensors, einops, tqdm, matplotlib, scipy; no network): installs
#                                          the carried wheels with --no-index --target, then runs the checks
#   benchmarks/gpu_check.sh --cpu-dry-run  anywhere: the same logic on the CPU, small (no GPU needed)
#
# artifacts/gpu_carry/ is git-ignored: carry it with the working tree (about 4 MiB; the tree limit is 64 MiB).
# PYTHON selects the interpreter (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/artifacts/gpu_carry"
PY="${PYTHON:-python3}"
# transformer-lens and the pure-Python packages it and saegeo import that the GPU machine does not have (--no-deps:
# torch, transformers, numpy, ... are taken from that machine as they are)
WHEELS=(transformer-lens==3.9.0 jaxtyping==0.3.11 wadler-lindig==0.1.8 beartype==0.23.1 better-abc==0.0.3
        fancy-einsum==0.0.3 typeguard==4.6.1 threadpoolctl==3.8.0)

if [[ "${1:-}" == "--prepare" ]]; then
  mkdir -p "$CARRY/wheels" "$CARRY/tokenizer"
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/wheels" "${WHEELS[@]}"
  tok="$(PYTHONPATH="$ROOT" "$PY" -c 'from saegeo.activations.models import minilm_path; print(minilm_path())')"
  cp "$tok"/{tokenizer.json,tokenizer_config.json,vocab.txt,special_tokens_map.json,config.json} "$CARRY/tokenizer/"
  du -sh "$CARRY"
  exit 0
fi

ARGS=()
if [[ "${1:-}" == "--cpu-dry-run" ]]; then
  ARGS+=(--cpu-dry-run)
elif ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "no CUDA device visible to $PY: nothing to check on a GPU (use --cpu-dry-run to test the logic)" >&2
  exit 2
fi

SITE="$CARRY/site"
if ! "$PY" -c 'import transformer_lens, jaxtyping' 2>/dev/null; then
  if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
    echo "transformer-lens is not importable and $CARRY/wheels holds no wheels: run $0 --prepare where pip works" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$CARRY"/wheels/*.whl
fi
# transformer-lens imports datasets, pandas and rich at import time but uses them only in code this
# check never runs (dataset loading, patching tables, pretty printing, multi-GPU offload). Where the machine lacks
# one (datasets alone would bring pyarrow, ~40 MB), an import-only stub stands in; calling into it raises.
# FORCE_STUBS=1 uses the stubs even where the real packages exist (to test them on this machine).
STUBS="$CARRY/stubs"
"$PY" - "$STUBS" "${FORCE_STUBS:-0}" <<'PYEOF'
import importlib.util, pathlib, sys
root, force = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
body = ("def __getattr__(name):\n    raise AttributeError(f'{__name__}.{name}: a gpu_check.sh stub; install the real package')\n"
        "class _Stub:\n    def __init__(self, *a, **k):\n        raise ImportError(__name__ + ': a gpu_check.sh stub')\n")
stubs = {"datasets": {"iterable_dataset": "IterableDataset", "arrow_dataset": "Dataset", "load": "load_dataset"},
         "pandas": {}, "rich": {}}
for pkg, subs in stubs.items():
    if importlib.util.find_spec(pkg) is not None and not force:
        continue
    d = root / pkg
    d.mkdir(parents=True, exist_ok=True)
    names = {"datasets": ["load_dataset", "Dataset", "IterableDataset"], "rich": ["print"]}.get(pkg, [])
    (d / "__init__.py").write_text(body + "".join(f"{n} = _Stub\n" for n in names))
    for sub, name in subs.items():
        (d / f"{sub}.py").write_text(body + f"{name} = _Stub\n")
    print(f"stub: {pkg}", file=sys.stderr)
PYEOF
export PYTHONPATH="$ROOT${STUBS:+:$STUBS}${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
[[ -d "$CARRY/tokenizer" ]] && ARGS+=(--tokenizer "$CARRY/tokenizer")
# the whole run must end within 10 minutes, each part bounded by its timeout (estimates: no device has run it
# yet): the checks above (7 min), then the width-262k check (3:
# benchmarks/gpu_width_check.py, a 4.8 GB dictionary written to --work / $TMPDIR); WIDTH_ONLY=1 runs only the latter
# (the timeouts bound a device's time; a --cpu-dry-run on a shared machine may take longer and is not cut)
rc=0
CHECK_LIMIT=(timeout 420) WIDTH_LIMIT=(timeout 180)
[[ "${1:-}" == "--cpu-dry-run" ]] && CHECK_LIMIT=() WIDTH_LIMIT=()
if [[ "${WIDTH_ONLY:-0}" != "1" ]]; then
  "${CHECK_LIMIT[@]}" "$PY" "$ROOT/benchmarks/gpu_check.py" "${ARGS[@]}" || rc=$?
fi
WIDTH_ARGS=()
[[ "${1:-}" == "--cpu-dry-run" ]] && WIDTH_ARGS+=(--cpu-dry-run)
"${WIDTH_LIMIT[@]}" "$PY" "$ROOT/benchmarks/gpu_width_check.py" "${WIDTH_ARGS[@]}" || rc=$?
exit "$rc"
