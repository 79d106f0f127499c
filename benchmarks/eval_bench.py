"""Spliced-evaluation throughput: `saegeo eval` (splice_eval) vs a plain transformer-lens run_with_hooks loop.

Same model (SmolLM2-135M, bundled), same SAE, same windows (default corpus, context 64, BOS passed through),
methods interleaved over rounds (median reported) so machine load hits both alike; wall and CPU seconds.

  saegeo   splice_eval: blocks ≤ L once per batch, then the suffix from the hook on for clean and spliced;
           the zero and mean ablations for one window per batch (BOS passed through, every other position
           set to one vector: every window's ablated output is a prefix of that one's), the zero one once
           per evaluation; CE and KL
  plain    what an evaluation loop written against transformer-lens does (the shape of SAELens'
           get_recons_loss): four full `model.run_with_hooks(tokens, fwd_hooks=[(hook, replace)])` forwards
           per batch (clean, spliced, zero, mean), the same CE sums, on the model as transformer-lens lays
           it out (every weight contiguous: 3.9 copies W.T of the MLP and unembedding weights per forward)
  plain/fast  the same loop on saegeo's loaded model (weights stored so those copies are views): the
           splice's own share of the gain
  saegeo×3 / plain×3   three SAEs on the same tokens (a report's three columns): saegeo shares the prefix and
           the clean/zero/mean suffixes, the loop runs 3 × 4 full forwards
  floor / floor×3   the least any spliced evaluation runs: per batch one prefix (blocks ≤ L) and, per SAE, its
           reconstruction and one suffix from the hook on (logits), nothing scored
  saegeo kept / saegeo×3 kept   the same evaluations when an earlier one (another SAE, untimed) on the same
           model, hook and tokens kept its clean passes (saegeo.sae.evaluate.KEEP_BYTES): only the spliced
           suffixes run. "floor share" = floor time / saegeo's time (goal ≥ 0.9)

  SAELens  (when .venv-saelens exists: `make .venv-saelens/.installed`) SAELens 6.54.12's own evaluation core,
           `sae_lens.evals.get_recons_loss` (what `run_evals` runs per batch for CE and KL: clean, spliced and
           zero-ablated forwards through `run_with_hooks`), in its own venv on the same SmolLM2 weights (built
           there by saegeo's loader, then given transformer-lens' own layout), the same SAE (saved by saegeo,
           loaded by `SAE.load_from_disk`) and the same token batches, BOS as `ignore_tokens`.
           `run_evals` itself wants an ActivationsStore over a hub dataset; its CE/KL part is this function.

The CE numbers are printed side by side. saegeo and the plain loop agree exactly; SAELens differs by definition
(it zero-ablates BOS too, which makes SmolLM2's logits uniform: CE = log 49,152 = 10.80, and it drops the
prediction made at BOS from its means). SAELens' loss has no attention mask, so each padded batch reaches it as
groups of equal-length windows (the few short windows at document ends in batches of their own).

Usage: python benchmarks/eval_bench.py [--tokens 1024] [--layer 15] [--rounds 2] [--sae DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from saegeo.activations.corpus import CorpusSpec, iter_windows
from saegeo.activations.models import load_model
from saegeo.activations.runner import pad_windows, window_batches
from saegeo.sae import evaluate
from saegeo.sae.evaluate import EvalConfig, splice_eval_many
from saegeo.sae.model import SAE, SAEConfig

ROOT = Path(__file__).resolve().parents[1]
SAELENS_PY = ROOT / ".venv-saelens/bin/python"
SAELENS_SCRIPT = r"""
import json, statistics, sys, time
job = json.loads(sys.argv[1])
sys.path.insert(0, job["root"])
import torch
from safetensors.torch import load_file
import sae_lens
from sae_lens import SAE
from sae_lens.evals import get_recons_loss
from sae_lens.training.activation_scaler import ActivationScaler
from saegeo.activations.models import load_model

torch.set_num_threads(job["threads"])
model = load_model(job["model_dir"]).model
for param in model.parameters():  # transformer-lens' own layout, as a SAELens user has it
    param.data = param.data.contiguous()
sae = SAE.load_from_disk(job["sae_dir"], device="cpu")
batches = [t for _, t in sorted(load_file(job["tokens"]).items())]
times, sums = [], {}
with torch.inference_mode():
    for _ in range(job["rounds"]):
        w0, c0 = time.perf_counter(), time.process_time()
        sums = {}
        for tokens in batches:
            metrics = get_recons_loss(sae, model, ActivationScaler(), tokens, compute_kl=True, compute_ce_loss=True,
                                      ignore_tokens=[job["bos"]], hook_name=job["hook"])
            keep = tokens[:, :-1] != job["bos"]  # run_evals' mask: predictions made at BOS are dropped
            for name, value in metrics.items():
                value = value[keep] if value.shape[1] == keep.shape[1] else value[:, :-1][keep]
                total, n = sums.get(name, (0.0, 0))
                sums[name] = (total + float(value.double().sum()), n + value.numel())
        times.append((time.perf_counter() - w0, time.process_time() - c0))
out = {name: total / n for name, (total, n) in sums.items()}
out.update(wall=statistics.median(t[0] for t in times), cpu=statistics.median(t[1] for t in times),
           version=sae_lens.__version__)
print("JSON" + json.dumps(out))
"""


def saelens_recons_loss(sae: SAE, hook: str, batches, model_dir: Path, bos: int, rounds: int) -> dict | None:
    """SAELens' get_recons_loss over the same token batches in .venv-saelens (None when it is missing)."""
    if not SAELENS_PY.exists():
        print(f"{SAELENS_PY} missing: no SAELens row (make .venv-saelens/.installed)")
        return None
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        sae.save(Path(tmp) / "sae", provenance={"data": {"hook": hook}})
        # SAELens' loss has no attention mask: each padded batch goes in as groups of equal-length windows
        groups = []
        for tokens, attend, _ in batches:
            lengths = attend.sum(1)
            groups += [tokens[lengths == n, :n] for n in lengths.unique(sorted=True).tolist()]
        save_file({f"{i:05d}": t.contiguous() for i, t in enumerate(groups)}, str(Path(tmp) / "tokens.safetensors"))
        (Path(tmp) / "run.py").write_text(SAELENS_SCRIPT)
        job = dict(
            root=str(ROOT),
            model_dir=str(model_dir),
            sae_dir=str(Path(tmp) / "sae"),
            hook=hook,
            bos=bos,
            tokens=str(Path(tmp) / "tokens.safetensors"),
            rounds=rounds,
            threads=torch.get_num_threads(),
        )
        env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(
            [str(SAELENS_PY), str(Path(tmp) / "run.py"), json.dumps(job)], capture_output=True, text=True, env=env
        )
    if proc.returncode != 0:
        raise RuntimeError(f"SAELens subprocess failed:\n{proc.stderr[-3000:]}")
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")][-1][4:])


def random_topk(d: int, seed: int) -> SAE:
    sae = SAE(SAEConfig(d_in=d, d_sae=8 * d, activation="topk", k=32))
    with torch.no_grad():
        sae.init_weights(torch.Generator().manual_seed(seed))
    return sae.eval()


def plain_loop(model, saes, hook, batches):
    """Four full run_with_hooks forwards per batch and SAE; CE sums over the same predictions."""
    ce = {n: {v: 0.0 for v in ("clean", "spliced", "zero", "mean")} for n in saes}
    n_pred = 0
    for tokens, attend, store in batches:
        valid = attend[:, 1:]
        target = tokens[:, 1:][valid]
        n_pred += int(valid.sum())
        replace = store & attend
        for name, sae in saes.items():
            grabbed = {}

            def grab(act, hook):
                grabbed["x"] = act[replace]

            def setter(fn):
                def hook_fn(act, hook):
                    act = act.clone()
                    act[replace] = fn(act[replace])
                    return act

                return hook_fn

            variants = {
                "clean": grab,
                "spliced": setter(lambda x: sae(x)),
                "zero": setter(torch.zeros_like),
                "mean": setter(lambda x: x.mean(0).expand_as(x)),
            }
            for v, fn in variants.items():
                logits = model.run_with_hooks(tokens, fwd_hooks=[(hook, fn)])
                logp = F.log_softmax(logits[:, :-1][valid].float(), dim=-1)
                ce[name][v] -= float(logp.gather(1, target[:, None]).double().sum())
    return {n: {v: s / n_pred for v, s in d.items()} for n, d in ce.items()}, n_pred


def floor_loop(model, saes, layer, batches):
    """One prefix per batch and one spliced suffix per SAE: the work no spliced evaluation can skip."""
    for tokens, attend, store in batches:
        replace = store & attend
        resid = model(tokens, stop_at_layer=layer + 1)
        for sae in saes.values():
            spliced = resid.clone()
            spliced[replace] = sae(resid[replace])
            model(spliced, start_at_layer=layer + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per method per round (whole windows)")
    ap.add_argument("--layer", type=int, default=15, help="splice at blocks.LAYER.hook_resid_post")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8, help="windows per batch")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sae", default=None, help="an SAE for this hook (default: a random TopK k=32, 8× expansion)")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model("smollm2")
    hook = f"blocks.{args.layer}.hook_resid_post"
    sae = SAE.load(args.sae).eval() if args.sae else random_topk(loaded.d_model, 0)
    saes = {"a": sae, "b": random_topk(loaded.d_model, 1), "c": random_topk(loaded.d_model, 2)}
    warm = {"w": random_topk(loaded.d_model, 9)}  # evaluated (untimed) before a "kept" run: it keeps the clean passes
    spec = CorpusSpec(context=args.context, exclude_special=True)
    windows, n = [], 0
    for w in iter_windows(spec, loaded.tokenizer, "decoder"):
        windows.append(w)
        n += len(w.input_ids)
        if n >= args.tokens:
            break
    pad = loaded.tokenizer.pad_token_id
    batches = [pad_windows(b, pad) for b in window_batches(iter(windows), args.batch_size)]
    n_tokens = sum(int(a.sum()) for _, a, _ in batches)
    print(
        f"SmolLM2-135M, {hook}, default corpus, context {args.context}, {len(windows)} windows = {n_tokens} tokens "
        f"in batches of {args.batch_size}, {args.rounds} rounds, torch threads {torch.get_num_threads()}"
    )
    cfg = EvalConfig(
        corpus="default",
        hook=hook,
        context=args.context,
        max_tokens=n_tokens,
        skip_tokens=0,
        batch_windows=args.batch_size,
        pass_special=True,
        progress=False,
    )

    def timed(fn):
        setup, run = fn if isinstance(fn, tuple) else (evaluate._KEPT.clear, fn)  # cold unless set up
        setup()
        w0, c0 = time.perf_counter(), time.process_time()
        out = run()
        return out, time.perf_counter() - w0, time.process_time() - c0

    def keep():
        evaluate._KEPT.clear()
        splice_eval_many(cfg, warm, loaded)

    stock = copy.deepcopy(loaded.model)
    for param in stock.parameters():  # transformer-lens' own layout
        param.data = param.data.contiguous()
    one = {"a": saes["a"]}
    methods = {
        "floor": lambda: floor_loop(loaded.model, one, args.layer, batches),
        "saegeo": lambda: splice_eval_many(cfg, one, loaded),
        "saegeo kept": (keep, lambda: splice_eval_many(cfg, one, loaded)),
        "plain": lambda: plain_loop(stock, one, hook, batches),
        "plain/fast": lambda: plain_loop(loaded.model, one, hook, batches),
        "floor×3": lambda: floor_loop(loaded.model, saes, args.layer, batches),
        "saegeo×3": lambda: splice_eval_many(cfg, saes, loaded),
        "saegeo×3 kept": (keep, lambda: splice_eval_many(cfg, saes, loaded)),
        "plain×3": lambda: plain_loop(stock, saes, hook, batches),
    }
    times = {m: [] for m in methods}
    outs = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for m, fn in methods.items():
                outs[m], wall, cpu = timed(fn)
                times[m].append((wall, cpu))
    print(f"{'method':<13} {'wall s':>8} {'CPU s':>8} {'tok/s':>8}   CE clean / spliced / zero / mean (SAE a)")
    for m, ts in times.items():
        wall = statistics.median(t[0] for t in ts)
        cpu = statistics.median(t[1] for t in ts)
        o = outs[m]
        if m.startswith("floor"):
            print(f"{m:<13} {wall:>8.1f} {cpu:>8.1f} {n_tokens / wall:>8.1f}   (nothing scored)")
            continue
        if m.startswith("saegeo"):
            r = o["a"]
            ce = (r["ce_loss_clean"], r["ce_loss_spliced"], r["ce_loss_zero_ablation"], r["ce_loss_mean_ablation"])
        else:
            r = o[0]["a"]
            ce = (r["clean"], r["spliced"], r["zero"], r["mean"])
        print(f"{m:<13} {wall:>8.1f} {cpu:>8.1f} {n_tokens / wall:>8.1f}   " + " / ".join(f"{c:.4f}" for c in ce))
    med = {m: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for m, ts in times.items()}
    from saegeo.activations.models import smollm2_path

    sl = saelens_recons_loss(saes["a"], hook, batches, smollm2_path(), loaded.tokenizer.bos_token_id, args.rounds)
    pairs = [("saegeo", "plain"), ("saegeo", "plain/fast"), ("saegeo×3", "plain×3")]
    if sl is not None:
        med["SAELens"] = (sl["wall"], sl["cpu"])
        print(
            f"{'SAELens':<13} {sl['wall']:>8.1f} {sl['cpu']:>8.1f} {n_tokens / sl['wall']:>8.1f}   "
            f"{sl['ce_loss_without_sae']:.4f} / {sl['ce_loss_with_sae']:.4f} / {sl['ce_loss_with_ablation']:.4f} / —"
            f"   (sae-lens {sl['version']} get_recons_loss: CE and KL, 3 forwards per batch; "
            f"KL spliced {sl['kl_div_with_sae']:.4f}, saegeo's {outs['saegeo']['a']['kl_div_spliced']:.4f})"
        )
        pairs.insert(0, ("saegeo", "SAELens"))
    for a, b in pairs:
        print(f"{a} vs {b}: {med[b][0] / med[a][0]:.2f}× tokens/s (wall), {med[b][1] / med[a][1]:.2f}× in CPU seconds")
    for floor, runs in (("floor", ("saegeo", "saegeo kept")), ("floor×3", ("saegeo×3", "saegeo×3 kept"))):
        for m in runs:
            print(
                f"floor share, {m}: {med[floor][0] / med[m][0]:.2f} (wall), {med[floor][1] / med[m][1]:.2f} "
                f"(CPU s)   [goal >= 0.9; {floor} = one prefix + one suffix per SAE]"
            )


if __name__ == "__main__":
    main()
